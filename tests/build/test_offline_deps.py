"""build_tools.offline_deps: the runtime dependencies of the pinned artifacts against what an
offline folder and the environment hold, on synthetic wheels and sdists."""

import io
import tarfile
import zipfile

import pytest
from packaging.requirements import Requirement

from build_tools import offline_deps, pinned


def _wheel(folder, name, version, requires=()):
    path = folder / f"{name}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return path


def _sdist(folder, filename, requires=()):
    path = folder / filename
    meta = "Metadata-Version: 2.1\nName: x\nVersion: 1\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    data = meta.encode()
    with tarfile.open(path, "w:gz") as sdist:
        info = tarfile.TarInfo(filename[: -len(".tar.gz")] + "/PKG-INFO")
        info.size = len(data)
        sdist.addfile(info, io.BytesIO(data))
    return path


def test_requirements_come_from_metadata_without_extras_and_foreign_markers(tmp_path):
    wheel = _wheel(tmp_path, "a", "1.0", ["b>=2", 'c; extra == "test"', 'd; sys_platform == "x"'])
    reqs = offline_deps.runtime_requirements(offline_deps.declared_requirements(wheel))
    assert [str(r) for r in reqs] == ["b>=2"]
    sdist = _sdist(tmp_path, "s-1.tar.gz", ["e"])
    assert [str(r) for r in offline_deps.declared_requirements(sdist)] == ["e"]


def test_missing_follows_the_folders_wheels_and_trusts_installed_packages(tmp_path):
    _wheel(tmp_path, "dep_one", "1.5", ["dep_two>=3", "pytest"])  # pytest: installed here
    _wheel(tmp_path, "dep_two", "2.0")  # too old for dep_one
    reqs = [Requirement("dep-one>=1"), Requirement("pinned-pkg==9"), Requirement("absent[x]<2")]
    gaps = offline_deps.missing(reqs, tmp_path, pinned_names=["pinned_pkg"])
    assert gaps == ["absent[x]<2", "dep_two>=3"]
    _wheel(tmp_path, "dep_two", "3.1")
    assert offline_deps.missing(reqs, tmp_path, pinned_names=["pinned_pkg"]) == ["absent[x]<2"]


def test_missing_follows_the_extras_a_requirement_asks_for(tmp_path):
    """nvidia-cudnn-frontend needs nvidia-cutlass-dsl[cu13]: the extra's libraries count too
    (and an extra nobody asks for does not)."""
    _wheel(tmp_path, "dsl", "4.8", ["dsl_base==4.8", 'dsl_cu13==4.8; extra == "cu13"',
                                    'dsl_qnx==4.8; extra == "qnx"'])  # fmt: skip
    _wheel(tmp_path, "dsl_base", "4.8")
    reqs = [Requirement("dsl[cu13]>=4")]
    assert offline_deps.missing(reqs, tmp_path) == ["dsl_cu13==4.8"]
    assert offline_deps.missing([Requirement("dsl>=4")], tmp_path) == []
    _wheel(tmp_path, "dsl_cu13", "4.8")
    assert offline_deps.missing(reqs, tmp_path) == []


def test_check_folder_reads_every_pinned_artifact(tmp_path, monkeypatch):
    pure = pinned.Artifact("pure", "pure-1-py3-none-any.whl", "0")
    core = pinned.Artifact("core", "core-1-py3-none-any.whl", "0")
    sdist = pinned.Artifact("ext", "ext-1.tar.gz", "0")
    monkeypatch.setattr(pinned, "install_artifacts", lambda cuda: (pure, sdist, core))
    _wheel(tmp_path, "pure", "1", ["core==1", "needed_a"])
    _wheel(tmp_path, "core", "1", ["needed_b>=2"])
    with pytest.raises(FileNotFoundError, match="ext-1.tar.gz"):
        offline_deps.check_folder(tmp_path, 13)
    assert offline_deps.main([str(tmp_path)]) == 2
    _sdist(tmp_path, "ext-1.tar.gz", ["pure==1", "needed_c"])
    assert offline_deps.check_folder(tmp_path, 13) == ["needed_a", "needed_b>=2", "needed_c"]
    assert offline_deps.main([str(tmp_path)]) == 1
    for name in ("needed_a", "needed_b", "needed_c"):
        _wheel(tmp_path, name, "2")
    assert offline_deps.main([str(tmp_path)]) == 0


def test_not_a_folder_exits_2(tmp_path, capsys):
    assert offline_deps.main([str(tmp_path / "nowhere")]) == 2
    assert "is not a folder" in capsys.readouterr().err
