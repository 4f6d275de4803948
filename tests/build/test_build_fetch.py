"""Pinned artifacts and their sha256 verification (no network: files are made locally)."""

import pytest

from build_tools import fetch, pinned

WHEEL = pinned.PURE_PYTHON_WHEEL


def test_offline_sha256_mismatch_names_file_and_hashes(tmp_path):
    (tmp_path / WHEEL.filename).write_bytes(b"not the upstream wheel")
    with pytest.raises(fetch.ArtifactError) as error:
        fetch.fetch(WHEEL, offline_dir=tmp_path)
    message = str(error.value)
    assert WHEEL.filename in message
    assert f"expected {WHEEL.sha256}" in message
    assert f"actual   {fetch.sha256_of(tmp_path / WHEEL.filename)}" in message


def test_offline_env_variable_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv(fetch.OFFLINE_ENV, str(tmp_path))
    with pytest.raises(fetch.ArtifactError, match=f"{WHEEL.filename} is not in {tmp_path}"):
        fetch.fetch(WHEEL, cache_dir=tmp_path / "never-used")


def test_corrupt_cache_entry_is_not_trusted(tmp_path, monkeypatch):
    monkeypatch.delenv(fetch.OFFLINE_ENV, raising=False)
    (tmp_path / WHEEL.filename).write_bytes(b"truncated")
    with pytest.raises(fetch.ArtifactError, match="sha256 mismatch"):
        fetch.fetch(WHEEL, cache_dir=tmp_path)


def test_verified_file_is_returned(pure_wheel, tmp_path):
    assert fetch.fetch(WHEEL, offline_dir=pure_wheel.parent) == pure_wheel.parent / WHEEL.filename
    assert fetch.verify(pure_wheel, WHEEL) == pure_wheel


def test_pins():
    assert {a.project for a in pinned.ALL_ARTIFACTS} == {
        "transformer_engine",
        "transformer_engine_torch",
        "transformer_engine_cu12",
        "transformer_engine_cu13",
    }
    for artifact in pinned.ALL_ARTIFACTS:
        assert len(artifact.sha256) == 64 and pinned.UPSTREAM_VERSION in artifact.filename
        assert pinned.by_filename(artifact.filename) is artifact
    assert pinned.core_wheel(13).platform_tag == "manylinux_2_28_x86_64"
    assert WHEEL.platform_tag == "any" and pinned.TORCH_SDIST.is_sdist
    assert pinned.install_requirements(12) == [
        "transformer_engine_cu12==2.20.2",
        "transformer_engine_torch==2.20.2",
    ]
    with pytest.raises(ValueError, match="CUDA 11 is not supported"):
        pinned.core_wheel(11)
