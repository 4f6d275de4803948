"""The strict unified-diff applier, on small synthetic files."""

import pytest

from build_tools.patching import PatchError, apply_patch, make_patch, read_series

PATH = "transformer_engine/mod.py"
OLD = "".join(f"line {i}\n" for i in range(1, 21))


def _write(root, relative, text):
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _patch(tmp_path, text, name="0001-test.patch"):
    return _write(tmp_path / "patches", name, text)


def test_applies_exact_patch(tmp_path):
    new = OLD.replace("line 5\n", "line 5\nadded\n").replace("line 15\n", "")
    _write(tmp_path / "tree", PATH, OLD)
    changed = apply_patch(_patch(tmp_path, make_patch(OLD, new, PATH)), tmp_path / "tree")
    assert changed == [PATH]
    assert (tmp_path / "tree" / PATH).read_text() == new


def test_mismatch_names_patch_file_hunk_and_line(tmp_path):
    patch = _patch(tmp_path, make_patch(OLD, OLD.replace("line 10\n", "ten\n"), PATH))
    _write(tmp_path / "tree", PATH, OLD.replace("line 9\n", "line nine\n"))
    with pytest.raises(PatchError) as error:
        apply_patch(patch, tmp_path / "tree")
    message = str(error.value)
    assert "0001-test.patch" in message and PATH in message
    assert "@@ -7,7 +7,7 @@" in message
    assert "line 9 should be 'line 9\\n' but is 'line nine\\n'" in message


def test_no_offset_allowed(tmp_path):
    patch = _patch(tmp_path, make_patch(OLD, OLD.replace("line 10\n", "ten\n"), PATH))
    _write(tmp_path / "tree", PATH, "extra\n" + OLD)
    with pytest.raises(PatchError, match="match at line 8: regenerate the patch"):
        apply_patch(patch, tmp_path / "tree")


def test_failed_patch_writes_nothing(tmp_path):
    other = "transformer_engine/other.py"
    text = make_patch(OLD, OLD.replace("line 2\n", "two\n"), PATH)
    text += make_patch(OLD, OLD.replace("line 3\n", "three\n"), other)
    _write(tmp_path / "tree", PATH, OLD)
    _write(tmp_path / "tree", other, OLD.replace("line 4\n", "four\n"))
    with pytest.raises(PatchError, match="other.py"):
        apply_patch(_patch(tmp_path, text), tmp_path / "tree")
    assert (tmp_path / "tree" / PATH).read_text() == OLD


def test_missing_target(tmp_path):
    patch = _patch(tmp_path, make_patch(OLD, OLD + "x\n", PATH))
    (tmp_path / "tree").mkdir()
    with pytest.raises(PatchError, match="no such file in the upstream tree"):
        apply_patch(patch, tmp_path / "tree")


def test_no_newline_at_end_of_file(tmp_path):
    old, new = "a\nb\nc", "a\nb\nc\nd\n"
    text = make_patch(old, new, PATH)
    assert "\\ No newline at end of file" in text
    _write(tmp_path / "tree", PATH, old)
    apply_patch(_patch(tmp_path, text), tmp_path / "tree")
    assert (tmp_path / "tree" / PATH).read_text() == new


def test_only_newlines_split_lines(tmp_path):
    old = "a\fb\nc\x1cd\ne\n"
    _write(tmp_path / "tree", PATH, old)
    apply_patch(_patch(tmp_path, make_patch(old, old.replace("e", "E"), PATH)), tmp_path / "tree")
    assert (tmp_path / "tree" / PATH).read_text() == old.replace("e", "E")


@pytest.mark.parametrize(
    "edit, error",
    [
        (lambda t: t.replace("@@ -7,7 +7,7 @@", "@@ -7,6 +7,6 @@"), "unexpected hunk line"),
        (lambda t: t.replace("@@ -7,7 +7,7 @@", "@@ -7,8 +7,8 @@"), "ends early"),
        (lambda t: t.replace(" line 7\n", "\n"), "did an editor strip trailing whitespace"),
        (lambda t: t.replace("+++ b/", "+++ b/x"), "one PATH"),
        (lambda t: t.replace("--- a/" + PATH, "--- /dev/null"), "creates or deletes a file"),
        (lambda t: t.replace(PATH, "../evil.py"), "leaves the tree"),
        (lambda t: t.replace("@@ -7,7 +7,7 @@", "@@ -7,7 +8,7 @@"), "inconsistent header"),
        (lambda t: "just text\n", "no file diff found"),
    ],
)
def test_malformed_patches(tmp_path, edit, error):
    text = edit(make_patch(OLD, OLD.replace("line 10\n", "ten\n"), PATH))
    _write(tmp_path / "tree", PATH, OLD)
    with pytest.raises(PatchError, match=error):
        apply_patch(_patch(tmp_path, text), tmp_path / "tree")
    assert (tmp_path / "tree" / PATH).read_text() == OLD


def test_description_before_the_diff_is_ignored(tmp_path):
    text = "Why: a description.\n- a bullet\n\n" + make_patch(OLD, "new\n" + OLD, PATH)
    _write(tmp_path / "tree", PATH, OLD)
    apply_patch(_patch(tmp_path, text), tmp_path / "tree")
    assert (tmp_path / "tree" / PATH).read_text() == "new\n" + OLD


def test_series_order_and_strictness(tmp_path):
    patches = tmp_path / "patches"
    for name in ("0001-a.patch", "0002-b.patch"):
        _write(patches, name, "")
    _write(patches, "series", "# comment\n0002-b.patch\n\n0001-a.patch\n")
    assert [p.name for p in read_series(patches)] == ["0002-b.patch", "0001-a.patch"]
    _write(patches, "0003-c.patch", "")
    _write(patches, "series", "0001-a.patch\n0001-a.patch\n0004-d.patch\n")
    with pytest.raises(PatchError) as error:
        read_series(patches)
    for problem in ("0001-a.patch is listed twice", "0004-d.patch is listed but missing"):
        assert problem in str(error.value)
    assert "0002-b.patch is not listed" in str(error.value)
