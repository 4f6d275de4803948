"""setup.py: the wheel satisfies upstream's install checks; requirements follow torch's CUDA."""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest
from setuptools import Distribution
from setuptools.errors import SetupError

from build_tools import REPO_ROOT, commands, env, pinned

SOURCES = [
    "setup.py",
    "pyproject.toml",
    "MANIFEST.in",
    "build_tools",
    "patches",
    "transformer_engine",
]


FAKE_CMAKE_BUILD = """
from pathlib import Path


def build_extension(source_dir, build_dir, install_dir):
    assert (Path(source_dir) / "setup.py").is_file() and build_dir != install_dir
    install_dir.mkdir(parents=True)
    library = install_dir / "transformer_engine_exact_fp8.so"
    library.write_bytes(b"not really a shared object")
    return library
"""


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A copy of the sources setup.py uses (builds must not touch the repository)."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (REPO_ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__")
            shutil.copytree(REPO_ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy(REPO_ROOT / name, source / name)
    return source


def _build_wheel(source, out, pure_wheel, **variables):
    build_env = dict(os.environ, NVTE_FORK_CUDA_MAJOR="13", **variables)
    build_env["NVTE_FORK_ARTIFACTS_DIR"] = str(pure_wheel.parent)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", out]
    subprocess.run([*map(str, cmd), str(source)], check=True, env=build_env, capture_output=True)
    (path,) = out.glob("*.whl")
    return path


@pytest.fixture(scope="module")
def wheel(sources, pure_wheel, tmp_path_factory):
    """The fork's wheel, built offline, without the CUDA extension."""
    out = tmp_path_factory.mktemp("wheel")
    return _build_wheel(sources, out, pure_wheel, NVTE_FORK_SKIP_EXT="1")


def test_wheel_metadata(wheel):
    assert wheel.name == "transformer_engine-2.20.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        wheel_file = archive.read("transformer_engine-2.20.2.dist-info/WHEEL").decode()
        metadata = archive.read("transformer_engine-2.20.2.dist-info/METADATA").decode()
        recipe = archive.read("transformer_engine/common/recipe/__init__.py").decode()
    assert "Root-Is-Purelib: true" in wheel_file
    assert "Name: transformer-engine\nVersion: 2.20.2\n" in metadata
    assert "Requires-Dist: transformer_engine_cu13==2.20.2" in metadata
    assert "Requires-Dist: transformer_engine_torch==2.20.2" in metadata
    assert "fp8_dpa_mask_exact" in recipe


AUDIT_MODULE = "transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.audit"


def test_wheel_declares_the_audit_command(wheel):
    with zipfile.ZipFile(wheel) as archive:
        entry_points = archive.read("transformer_engine-2.20.2.dist-info/entry_points.txt").decode()
        names = archive.namelist()
    assert "[console_scripts]" in entry_points
    assert f"te-fp8-causality-audit = {AUDIT_MODULE}.cli:main" in entry_points
    assert f"{AUDIT_MODULE.replace('.', '/')}/cli.py" in names


def test_installed_audit_command_runs(wheel, tmp_path):
    """pip puts a te-fp8-causality-audit script in bin/ that reaches the audit's main().

    The installed package's `transformer_engine/__init__.py` loads TE's core library, which this
    machine lacks, so the script runs against the repository's tree of the same files."""
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target)]
    subprocess.run([*pip, str(wheel)], check=True, capture_output=True)
    script = target / "bin" / "te-fp8-causality-audit"
    assert script.is_file() and os.access(script, os.X_OK)
    run_env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    run = [sys.executable, str(script)]
    result = subprocess.run([*run, "--help"], env=run_env, capture_output=True, text=True)
    assert result.returncode == 0 and "--max-distance" in result.stdout
    result = subprocess.run([*run, "--trials", "0"], env=run_env, capture_output=True, text=True)
    assert result.returncode == 2 and "--trials: must be >= 1" in result.stderr


def test_editable_install_is_refused(sources, tmp_path):
    """`pip install -e .` fails with the reason instead of installing an empty package.

    Offline: no build isolation, no dependencies, no index, an empty artifacts folder."""
    source = shutil.copytree(sources, tmp_path / "source", ignore=shutil.ignore_patterns("build"))
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    build_env = dict(
        os.environ, NVTE_FORK_CUDA_MAJOR="13", NVTE_FORK_ARTIFACTS_DIR=str(artifacts)
    )
    prefix = tmp_path / "prefix"
    cmd = [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps"]
    cmd += ["--no-index", "--prefix", str(prefix), "-e", str(source)]
    result = subprocess.run(cmd, env=build_env, capture_output=True, text=True)
    assert result.returncode != 0
    assert "editable installs (pip install -e) are not supported" in result.stdout + result.stderr
    assert not prefix.exists()


@pytest.mark.filterwarnings("ignore:.*develop")  # setuptools deprecates the command itself
def test_setup_py_develop_is_refused():
    develop = commands.Develop(Distribution())
    with pytest.raises(SetupError, match="editable installs"):
        develop.run()


UPSTREAM_CHECK = """
import ast, functools, sys
from importlib.metadata import PackageNotFoundError, distribution, version
tree = ast.parse(open(sys.argv[1]).read())
wanted = ("_is_package_installed", "_is_package_installed_from_wheel")
body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
ns = dict(functools=functools, distribution=distribution, PackageNotFoundError=PackageNotFoundError)
exec(compile(ast.Module(body=body, type_ignores=[]), "upstream", "exec"), ns)
print(ns["_is_package_installed_from_wheel"]("transformer_engine"), version("transformer-engine"))
"""


def test_installed_wheel_passes_upstreams_check(wheel, tmp_path):
    """Run upstream's own `_is_package_installed_from_wheel` (from the installed tree)."""
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target)]
    subprocess.run([*pip, str(wheel)], check=True, capture_output=True)
    common = target / "transformer_engine/common/__init__.py"
    run_env = dict(os.environ, PYTHONPATH=str(target))
    result = subprocess.run(
        [sys.executable, "-c", UPSTREAM_CHECK, str(common)],
        env=run_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.split() == ["True", "2.20.2"]


def test_cuda_major_from_torch(monkeypatch):
    monkeypatch.delenv(env.CUDA_MAJOR_ENV, raising=False)
    monkeypatch.setattr(env, "_probe_torch", lambda: ("2.9.0+cu128", "12.8"))
    assert env.detect_cuda_major() == 12
    monkeypatch.setattr(env, "_probe_torch", lambda: ("2.13.0+cpu", ""))
    with pytest.raises(env.BuildEnvironmentError, match="CPU-only build"):
        env.detect_cuda_major()
    monkeypatch.setattr(env, "_probe_torch", lambda: ("2.0.0", "11.8"))
    with pytest.raises(env.BuildEnvironmentError, match="must be 12 or 13"):
        env.detect_cuda_major()


def test_cuda_major_override(monkeypatch):
    monkeypatch.setenv(env.CUDA_MAJOR_ENV, "13")
    assert commands.install_requires(["setup.py", "bdist_wheel"]) == pinned.install_requirements(13)
    monkeypatch.setenv(env.CUDA_MAJOR_ENV, "cu13")
    with pytest.raises(SystemExit, match="NVTE_FORK_CUDA_MAJOR=cu13"):
        commands.install_requires(["setup.py", "bdist_wheel"])
    assert commands.install_requires(["setup.py", "sdist"]) == [pinned.TORCH_SDIST.requirement]


def test_missing_extension_warns_or_fails(monkeypatch, capsys):
    build_ext = commands.BuildExt(Distribution({"ext_modules": [commands.extension()]}))
    monkeypatch.delenv(env.REQUIRE_EXT_ENV, raising=False)
    build_ext._skip("no nvcc")
    assert "transformer_engine_exact_fp8 not built: no nvcc" in capsys.readouterr().err
    monkeypatch.setenv(env.REQUIRE_EXT_ENV, "1")
    with pytest.raises(SetupError, match="not built: no nvcc"):
        build_ext._skip("no nvcc")


def test_wheel_with_extension(sources, pure_wheel, tmp_path):
    """build_tools.cmake_build's library lands next to the package; the wheel stays purelib."""
    source = shutil.copytree(sources, tmp_path / "source", ignore=shutil.ignore_patterns("build"))
    (source / "build_tools" / "cmake_build.py").write_text(FAKE_CMAKE_BUILD)
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    wheel = _build_wheel(source, tmp_path, pure_wheel, CUDACXX=str(nvcc), NVTE_FORK_SKIP_EXT="0")
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert wheel.name.startswith(f"transformer_engine-2.20.2-{tag}-{tag}-linux_")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        wheel_file = archive.read("transformer_engine-2.20.2.dist-info/WHEEL").decode()
    assert "Root-Is-Purelib: true" in wheel_file
    (library,) = [n for n in names if n.startswith("transformer_engine_exact_fp8")]
    assert "/" not in library and library.endswith(".so")
