"""The patch series against the pinned upstream wheel, and what its patches must contain."""

import ast
import re

import pytest

from build_tools import PATCHES_DIR, assemble
from build_tools.patching import PatchError, apply_patch, read_series

RECIPE = "transformer_engine/common/recipe/__init__.py"
FIELD_DEFAULT = 'os.getenv("NVTE_FP8_DPA_MASK_EXACT", "1") == "1"'


@pytest.fixture
def patched(tree):
    for patch in read_series(PATCHES_DIR):
        apply_patch(patch, tree)
    return tree


def test_series_applies_to_pinned_upstream(tree, upstream_tree):
    touched = [path for patch in read_series(PATCHES_DIR) for path in apply_patch(patch, tree)]
    assert RECIPE in touched
    for path in touched:
        assert (tree / path).read_bytes() != (upstream_tree / path).read_bytes()


def test_check_cli_reports_success(pure_wheel, capsys):
    assert assemble.check(offline_dir=pure_wheel.parent) == 0
    out = capsys.readouterr().out
    assert re.search(r"^OK +0001-recipe-mask-exact-fp8-dpa-field\.patch", out, re.M)


def _class(module: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name)


def _fields(cls: ast.ClassDef):
    return [n for n in cls.body if isinstance(n, ast.AnnAssign)]


@pytest.mark.parametrize("recipe", ["Float8CurrentScaling", "MXFP8BlockScaling"])
def test_recipe_has_mask_exact_field(patched, recipe):
    source = (patched / RECIPE).read_text()
    cls = _class(ast.parse(source), recipe)
    last = _fields(cls)[-1]  # appended last: positional construction keeps working
    assert last.target.id == "fp8_dpa_mask_exact"
    assert ast.unparse(last.annotation) == "bool"
    assert ast.get_source_segment(source, last.value) == FIELD_DEFAULT
    doc = ast.get_docstring(cls)
    assert "fp8_dpa_mask_exact : bool, default = True" in doc
    assert "NVTE_FP8_DPA_MASK_EXACT=0" in doc and "docs/mask_exact_fp8.md" in doc
    make_repr = next(n for n in cls.body if getattr(n, "name", "") == "_make_repr")
    assert "fp8_dpa_mask_exact={self.fp8_dpa_mask_exact}" in ast.get_source_segment(
        source, make_repr
    )


def test_other_recipes_untouched(patched):
    module = ast.parse((patched / RECIPE).read_text())
    for name in ("DelayedScaling", "Float8BlockScaling", "NVFP4BlockScaling"):
        fields = [f.target.id for f in _fields(_class(module, name))]
        assert "fp8_dpa_mask_exact" not in fields


def test_broken_patch_names_file_and_hunk(tree, tmp_path, capsys):
    real = PATCHES_DIR / "0001-recipe-mask-exact-fp8-dpa-field.patch"
    broken_dir = tmp_path / "patches"
    broken_dir.mkdir()
    text = real.read_text().replace(" \n     use_power_2_scales", " \n     use_power_of_2_scales")
    assert text != real.read_text()
    (broken_dir / real.name).write_text(text)
    (broken_dir / "series").write_text(real.name + "\n")
    with pytest.raises(PatchError) as error:
        apply_patch(broken_dir / real.name, tree)
    message = str(error.value)
    assert real.name in message and RECIPE in message
    assert "hunk #1 @@ -297,6 +297,10 @@" in message
    assert "use_power_of_2_scales" in message
    assert assemble.check(patches_dir=broken_dir) == 1
    assert "FAIL 0001-recipe-mask-exact-fp8-dpa-field.patch" in capsys.readouterr().out


def test_every_patch_is_described():
    readme = (PATCHES_DIR / "README.md").read_text()
    for patch in read_series(PATCHES_DIR):
        assert f"`{patch.name}`" in readme, f"patches/README.md lacks a line for {patch.name}"
