"""The pinned CUTLASS headers (build time only): sha256-checked like the upstream artifacts,
offline folder honoured, unpacked once into the cache; and the attention kernel's build flags."""

import shutil

import pytest

from build_tools import cmake_build, fetch, pinned

WHEEL = pinned.CUTLASS_WHEEL


@pytest.fixture(scope="module")
def cutlass_wheel():
    """The real pinned wheel (6.4 MB): NVTE_FORK_ARTIFACTS_DIR, else the cache (PyPI once)."""
    return fetch.fetch(WHEEL)


def test_pin():
    assert WHEEL.filename == "nvidia_cutlass-4.2.0.0-py3-none-any.whl"
    assert WHEEL.sha256 == "f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6"
    assert WHEEL.requirement == "nvidia_cutlass==4.2.0.0" and WHEEL.platform_tag == "any"
    assert pinned.by_filename(WHEEL.filename) is WHEEL
    assert WHEEL not in pinned.ALL_ARTIFACTS  # never a runtime requirement of the fork
    assert WHEEL in pinned.BUILD_ARTIFACTS


def test_offline_sha256_mismatch_is_refused_and_nothing_unpacked(tmp_path):
    offline, cache = tmp_path / "offline", tmp_path / "cache"
    offline.mkdir()
    (offline / WHEEL.filename).write_bytes(b"not the cutlass wheel")
    with pytest.raises(fetch.ArtifactError) as error:
        fetch.cutlass_include_dir(cache_dir=cache, offline_dir=offline)
    message = str(error.value)
    assert "sha256 mismatch" in message and f"expected {WHEEL.sha256}" in message
    assert not cache.exists() or not any(cache.iterdir())


def test_corrupt_cached_wheel_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(fetch.OFFLINE_ENV, raising=False)
    (tmp_path / WHEEL.filename).write_bytes(b"truncated")
    with pytest.raises(fetch.ArtifactError, match="sha256 mismatch"):
        fetch.cutlass_include_dir(cache_dir=tmp_path)


def test_offline_env_variable_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv(fetch.OFFLINE_ENV, str(tmp_path))
    with pytest.raises(fetch.ArtifactError, match=f"{WHEEL.filename} is not in {tmp_path}"):
        fetch.cutlass_include_dir(cache_dir=tmp_path / "never-used")


def test_headers_unpacked_from_the_offline_folder(cutlass_wheel, tmp_path, monkeypatch):
    offline, cache = tmp_path / "offline", tmp_path / "cache"
    offline.mkdir()
    shutil.copyfile(cutlass_wheel, offline / WHEEL.filename)
    monkeypatch.setenv(fetch.OFFLINE_ENV, str(offline))
    include = fetch.cutlass_include_dir(cache_dir=cache)
    assert include.parent.parent == cache and WHEEL.sha256[:16] in include.parent.name
    for header in (
        "cute/tensor.hpp",
        "cute/atom/mma_traits_sm90_gmma.hpp",
        "cutlass/arch/barrier.h",
    ):
        assert (include / header).is_file(), header
    assert not (include / "cutlass_library").exists()  # only the include tree
    assert not list(cache.glob("*.whl"))  # offline: the wheel is read in place, not copied
    (include / "cute" / "marker").write_text("kept")  # a second call reuses the unpacked tree
    assert fetch.cutlass_include_dir(cache_dir=cache) == include
    assert (include / "cute" / "marker").read_text() == "kept"


def test_cli_verifies_the_cutlass_wheel(tmp_path, capsys):
    (tmp_path / WHEEL.filename).write_bytes(b"bad")
    assert fetch.main(["--cutlass", "--offline", str(tmp_path)]) == 1
    assert f"FAIL {WHEEL.filename}" in capsys.readouterr().err


def test_sm90_attention_is_built_with_an_sm90_arch_only():
    assert cmake_build.builds_sm90_attention(["90", "100a"])
    assert cmake_build.builds_sm90_attention(["90a"])
    assert not cmake_build.builds_sm90_attention(["100a"])
    assert not cmake_build.builds_sm90_attention(["89", "120"])
