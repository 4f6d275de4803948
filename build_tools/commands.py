"""The setuptools side of the build: requirements and commands used by setup.py.

- BuildPy puts the assembled `transformer_engine` tree (upstream + patches + new files) in
  build_lib.
- BuildExt builds the top-level CUDA extension `transformer_engine_exact_fp8` with
  build_tools.cmake_build; without nvcc it is skipped with a warning (an error with
  NVTE_FORK_REQUIRE_EXT=1).
- BdistWheel writes `Root-Is-Purelib: true`, which upstream's import-time check requires.
- EditableWheel and Develop refuse editable installs (`pip install -e .`, `setup.py develop`):
  the package only exists once assembled, so an editable install would install nothing.
"""

import shutil
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from setuptools import Extension
from setuptools.command.build import build
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop
from setuptools.command.editable_wheel import editable_wheel
from setuptools.errors import SetupError

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

from . import REPO_ROOT, assemble, env, fetch, pinned

EXTENSION_NAME = "transformer_engine_exact_fp8"

# Commands whose result depends on the dependency list; elsewhere (sdist, egg_info) a machine
# without CUDA PyTorch may still produce metadata.
_BUILDING_COMMANDS = {"bdist_wheel", "build", "build_ext", "develop", "dist_info", "install"}


def install_requires(argv: Optional[Sequence[str]] = None) -> List[str]:
    """transformer_engine_cu{12,13}==2.20.2 by the CUDA version of PyTorch, and the torch lib."""
    argv = sys.argv if argv is None else argv
    try:
        cuda_major = env.detect_cuda_major()
    except env.BuildEnvironmentError as e:
        if _BUILDING_COMMANDS & set(argv[1:]):
            raise SystemExit(f"error: {e}") from e
        return [pinned.TORCH_SDIST.requirement]
    _verify_offline_dependencies(cuda_major)
    return pinned.install_requirements(cuda_major)


def _verify_offline_dependencies(cuda_major: int) -> None:
    """In offline mode, check the artifacts pip will install from NVTE_FORK_ARTIFACTS_DIR."""
    folder = fetch.offline_dir_from_env()
    if folder is None:
        return
    for artifact in pinned.install_artifacts(cuda_major):
        if (folder / artifact.filename).is_file():
            fetch.verify(folder / artifact.filename, artifact)
        else:
            print(f"warning: {artifact.filename} is not in {folder}", file=sys.stderr)


def extension() -> Extension:
    """The fork's CUDA extension; its sources are built by CMake, not by setuptools."""
    return Extension(EXTENSION_NAME, sources=[])


class Build(build):
    """`build`, with build_py always run: the package comes from BuildPy, not from `packages`."""

    sub_commands = [("build_py", lambda self: True)] + [
        command for command in build.sub_commands if command[0] != "build_py"
    ]


EDITABLE_REFUSED = (
    "editable installs (pip install -e) are not supported: the fork's transformer_engine package"
    " is assembled at build time from upstream's wheel, the patches and this repository's files,"
    " so an editable install would leave nothing importable. Use `pip install"
    " --no-build-isolation .` (reinstall after a change), or `python -m build_tools.assemble --out"
    " DIR` and put DIR on PYTHONPATH (docs/building.md, 'Assembling by hand')."
)


class EditableWheel(editable_wheel):
    """Refuse PEP 660 editable installs (`pip install -e .`) before anything is built.

    setuptools runs a custom build_py of an editable build in a mode that turns its errors into
    warnings, so the refusal must come from this command itself."""

    def run(self):
        raise SetupError(EDITABLE_REFUSED)


class Develop(develop):
    """Refuse `setup.py develop` (the legacy editable install)."""

    def run(self):
        raise SetupError(EDITABLE_REFUSED)


class BuildPy(build_py):
    """Assemble the fork's `transformer_engine` package into build_lib."""

    def run(self):
        if getattr(self, "editable_mode", False):
            raise SetupError(EDITABLE_REFUSED)
        super().run()
        build_lib = Path(self.build_lib)
        shutil.rmtree(build_lib / pinned.PACKAGE, ignore_errors=True)
        package_dir = assemble.assemble(build_lib, offline_dir=fetch.offline_dir_from_env())
        self.announce(f"assembled {package_dir}", level=2)


class BuildExt(build_ext):
    """Build `transformer_engine_exact_fp8` with CMake, next to the `transformer_engine` package."""

    def build_extension(self, ext):
        if ext.name != EXTENSION_NAME:
            return super().build_extension(ext)
        target = Path(self.get_ext_fullpath(ext.name))
        target.unlink(missing_ok=True)  # never ship a stale build
        if env.extension_skipped():
            self._skip(f"{env.SKIP_EXT_ENV}=1")
        elif env.find_nvcc() is None:
            self._skip("nvcc (the CUDA compiler) was not found; set CUDA_HOME or PATH")
        else:
            self._build_with_cmake(target)

    def _build_with_cmake(self, target: Path) -> None:
        from .cmake_build import build_extension  # only needed with CUDA

        work = Path(self.build_temp).resolve() / EXTENSION_NAME
        built = build_extension(REPO_ROOT, work / "build", work / "install")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)

    def _skip(self, reason: str) -> None:
        message = (
            f"{EXTENSION_NAME} not built: {reason}. The fork is installed without its CUDA"
            f" extension; set {env.REQUIRE_EXT_ENV}=1 to make this an error."
        )
        if env.extension_required():
            raise SetupError(message)
        print(f"WARNING: {message}", file=sys.stderr)


class BdistWheel(bdist_wheel):
    """A wheel whose WHEEL file says `Root-Is-Purelib: true`, even with the extension inside.

    When a transformer_engine_cu* core package is installed, transformer_engine.common asserts
    that `transformer-engine` was installed from a wheel with `Root-Is-Purelib: true`
    (_is_package_installed_from_wheel). The files stay at the wheel's root (pip installs them
    into purelib), and the tag stays platform-specific when the extension is inside.
    """

    def get_tag(self):
        pure = self.root_is_pure
        self.root_is_pure = not self._has_extension()
        try:
            return super().get_tag()
        finally:
            self.root_is_pure = pure

    def write_wheelfile(self, *args, **kwargs):
        self.root_is_pure = True
        super().write_wheelfile(*args, **kwargs)

    def _has_extension(self) -> bool:
        outputs = self.get_finalized_command("build_ext").get_outputs()
        return any(Path(path).is_file() for path in outputs)


CMDCLASS = {
    "build": Build,
    "build_py": BuildPy,
    "build_ext": BuildExt,
    "bdist_wheel": BdistWheel,
    "editable_wheel": EditableWheel,
    "develop": Develop,
}
