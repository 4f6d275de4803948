"""Overlay of the repository's new files, and the build record."""

import importlib.util

import pytest

from build_tools import REPO_ROOT, assemble

PACKAGE = "transformer_engine"


def _repo(tmp_path, *files):
    for relative in files:
        path = tmp_path / "repo" / PACKAGE / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {relative}\n")
    return tmp_path / "repo"


def test_overlay_collision_is_an_error(tree, tmp_path):
    recipe = tree / PACKAGE / "common/recipe/__init__.py"
    before = recipe.read_bytes()
    repo = _repo(tmp_path, "common/recipe/__init__.py", "pytorch/new_module.py")
    with pytest.raises(assemble.OverlayError, match="transformer_engine/common/recipe/__init__.py"):
        assemble.overlay(tree / PACKAGE, repo)
    assert recipe.read_bytes() == before
    assert not (tree / PACKAGE / "pytorch/new_module.py").exists()


def test_overlay_file_under_an_upstream_file_collides(tree, tmp_path):
    repo = _repo(tmp_path, "pytorch/utils.py/inner.py")
    with pytest.raises(assemble.OverlayError, match="pytorch/utils.py/inner.py"):
        assemble.overlay(tree / PACKAGE, repo)


def test_overlay_adds_new_python_files_only(tree, tmp_path):
    new = ["pytorch/attention/dot_product_attention/exact_fp8/__init__.py", "common/x/data.json"]
    skipped = [
        "common/fused_attn/q.cu",
        "common/include/transformer_engine/q.h",
        "a/CMakeLists.txt",
    ]
    skipped += ["pytorch/__pycache__/m.cpython-311.pyc", ".hidden/x.py", "ext.so"]
    repo = _repo(tmp_path, *new, *skipped)
    assert [str(f) for f in assemble.overlay(tree / PACKAGE, repo)] == sorted(new)
    for relative in new:
        assert (tree / PACKAGE / relative).read_text() == f"# {relative}\n"
    for relative in skipped:
        assert not (tree / PACKAGE / relative).exists()


def test_unpack_refuses_a_used_folder(pure_wheel, tree):
    with pytest.raises(FileExistsError):
        assemble.unpack_package(pure_wheel, tree)


def _load(path):
    spec = importlib.util.spec_from_file_location("fork_build_info", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_assemble_with_this_repository(pure_wheel, tmp_path):
    package = assemble.assemble(tmp_path, offline_dir=pure_wheel.parent, repo_root=REPO_ROOT)
    for relative in assemble.overlay_files(REPO_ROOT):
        assert (package / relative).is_file()
    info = _load(package / assemble.BUILD_INFO)
    assert info.UPSTREAM_VERSION == "2.20.2"
    assert "common/recipe/__init__.py" in info.PATCHED_FILES
    info.check_patched_files()
    (package / "common/recipe/__init__.py").write_text("# reverted by a core-wheel reinstall\n")
    assert info.modified_patched_files() == ["common/recipe/__init__.py"]
    with pytest.raises(RuntimeError, match="Reinstall the fork"):
        info.check_patched_files()


def test_assemble_without_overlay_has_no_build_record(pure_wheel, tmp_path):
    package = assemble.assemble(tmp_path, offline_dir=pure_wheel.parent, repo_root=None)
    assert not (package / assemble.BUILD_INFO).exists()
    assert "fp8_dpa_mask_exact" in (package / "common/recipe/__init__.py").read_text()
