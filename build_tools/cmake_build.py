"""Build the CUDA extension `transformer_engine_exact_fp8` with CMake and ninja.

    python -m build_tools.cmake_build --build-dir build/ext --install-dir build/lib --arch 90
    python -m build_tools.cmake_build --compile-only --arch 90 --arch 100a

`build_extension` is what setup.py calls. `--compile-only` compiles the CUDA sources to object
files with nvcc alone, for the given architectures: no GPU, CMake or Python headers needed (CI
uses it to check that the kernels build for sm_90 and sm_100a).

The Hopper attention kernel (SM90A_SOURCES) is built for sm_90a only, and only when an sm_90
architecture is requested; it needs the CuTe/CUTLASS headers of the pinned `nvidia-cutlass`
wheel, which build_tools.fetch.cutlass_include_dir provides (sha256-checked, offline mode too).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional, Sequence

from . import REPO_ROOT, env, fetch

MODULE_NAME = "transformer_engine_exact_fp8"
CUDA_SOURCES = (
    "transformer_engine/common/fused_attn/exact_fp8_driver.cu",
    "transformer_engine/common/fused_attn/exact_fp8_offsets.cu",
    "transformer_engine/common/fused_attn/exact_fp8_quantize.cu",
    "transformer_engine/common/fused_attn/exact_fp8_rowwise.cu",
    "transformer_engine/common/fused_attn/exact_fp8_transposed.cu",
    "transformer_engine/common/fused_attn/exact_fp8_transposed_current.cu",
)
# The sm90 attention forward and backward: CuTe/CUTLASS, wgmma and TMA, so sm_90a only.
SM90A_SOURCES = (
    "transformer_engine/common/fused_attn/exact_fp8_attention_sm90/launcher.cu",
    "transformer_engine/common/fused_attn/exact_fp8_attention_sm90/driver_api.cu",
    "transformer_engine/common/fused_attn/exact_fp8_attention_sm90/backward_launcher.cu",
)
SM90A_GENCODE = "-gencode=arch=compute_90a,code=sm_90a"
# CuTe calls cuTensorMapEncodeTiled by name; driver_api.cu defines it (as CMakeLists.txt says)
SM90A_FLAGS = ("--expt-relaxed-constexpr", "-DCUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL=1")
INCLUDE_DIR = "transformer_engine/common/include"
ARCHS_ENV = "NVTE_FORK_CUDA_ARCHS"  # e.g. "90" or "90;100a"; CMakeLists.txt's default otherwise


class CMakeBuildError(RuntimeError):
    """CMake, ninja or nvcc failed, or the built module was not found."""


def _run(cmd: Sequence[str], cwd: Optional[Path] = None) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    result = subprocess.run([str(c) for c in cmd], cwd=cwd)
    if result.returncode != 0:
        raise CMakeBuildError(f"command failed with exit code {result.returncode}: {cmd[0]}")


def _nvcc() -> Path:
    nvcc = env.find_nvcc()
    if nvcc is None:
        raise CMakeBuildError("nvcc (the CUDA compiler) was not found; set CUDA_HOME or PATH")
    return nvcc


def builds_sm90_attention(archs: Sequence[str]) -> bool:
    """Whether a build for `archs` includes the sm_90a attention kernel (any sm_90 arch asked)."""
    return any(str(arch).startswith("90") for arch in archs)


def cutlass_include() -> Path:
    """The pinned CUTLASS headers (fetched, sha256-checked, unpacked once into the cache)."""
    try:
        return fetch.cutlass_include_dir()
    except fetch.ArtifactError as e:
        raise CMakeBuildError(
            f"the sm90 attention kernel needs the CUTLASS headers of"
            f" {fetch.pinned.CUTLASS_WHEEL.filename}: {e}"
        ) from e


def build_extension(
    source_dir: Path, build_dir: Path, install_dir: Path, archs: Optional[List[str]] = None
) -> Path:
    """Configure (cmake -G Ninja), build, and copy the module into install_dir; return its path.

    archs: CUDA architectures such as ["90", "100a"]; default $NVTE_FORK_CUDA_ARCHS, else the
    CMakeLists.txt default ("90;100a"). With an sm_90 architecture the module also holds the
    sm_90a attention kernel (the CUTLASS headers are fetched for it).
    """
    archs_arg = ";".join(archs) if archs else os.getenv(ARCHS_ENV)
    configure = [
        "cmake",
        "-S",
        Path(source_dir),
        "-B",
        Path(build_dir),
        "-G",
        "Ninja",
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DCMAKE_CUDA_COMPILER={_nvcc()}",
        f"-DPython_EXECUTABLE={sys.executable}",
    ]
    if archs_arg:
        configure.append(f"-DCMAKE_CUDA_ARCHITECTURES={archs_arg}")
    if builds_sm90_attention((archs_arg or "90;100a").split(";")):
        configure.append(f"-DEXACT_FP8_CUTLASS_INCLUDE_DIR={cutlass_include()}")
    _run(configure)
    _run(["cmake", "--build", Path(build_dir), "--target", MODULE_NAME])
    built = sorted(Path(build_dir).glob(f"{MODULE_NAME}*.so"))
    if len(built) != 1:
        raise CMakeBuildError(f"expected one {MODULE_NAME}*.so in {build_dir}, found {built}")
    install_dir = Path(install_dir)
    install_dir.mkdir(parents=True, exist_ok=True)
    target = install_dir / built[0].name
    shutil.copyfile(built[0], target)
    return target


def _gencode(arch: str) -> str:
    return f"-gencode=arch=compute_{arch},code=sm_{arch}"


def compile_only(
    archs: Sequence[str],
    out_dir: Path,
    source_dir: Path = REPO_ROOT,
    cutlass_include_dir: Optional[Path] = None,
    ptxas_verbose: bool = False,
) -> List[Path]:
    """Compile each CUDA source to an object file for every arch with nvcc; return the objects.

    With an sm_90 arch, SM90A_SOURCES are compiled for sm_90a too, against cutlass_include_dir
    (default: the pinned headers, fetched). ptxas_verbose prints their register use and spills.
    """
    nvcc = _nvcc()
    out_dir.mkdir(parents=True, exist_ok=True)
    objects = []
    common = [nvcc, "-std=c++17", "-O3", "-Xcompiler=-Wall", f"-I{source_dir / INCLUDE_DIR}"]
    for source in CUDA_SOURCES:
        obj = out_dir / (Path(source).stem + ".o")
        cmd = common + [_gencode(arch) for arch in archs]
        _run(cmd + ["-c", source_dir / source, "-o", obj])
        objects.append(obj)
    if builds_sm90_attention(archs):
        include = cutlass_include_dir or cutlass_include()
        for source in SM90A_SOURCES:
            obj = out_dir / ("sm90a_" + Path(source).stem + ".o")
            _run(sm90a_command(source, obj, include, source_dir, ptxas_verbose))
            objects.append(obj)
    return objects


def sm90a_command(
    source: str,
    obj: Path,
    cutlass_include_dir: Path,
    source_dir: Path = REPO_ROOT,
    ptxas_verbose=False,
) -> List[str]:
    """The nvcc command that compiles one of SM90A_SOURCES to `obj` for sm_90a."""
    cmd = [str(_nvcc()), "-std=c++17", "-O3", "-Xcompiler=-Wall", f"-I{source_dir / INCLUDE_DIR}"]
    cmd += [f"-I{cutlass_include_dir}", *SM90A_FLAGS, SM90A_GENCODE]
    if ptxas_verbose:
        cmd.append("-Xptxas=-v")
    return cmd + ["-c", str(source_dir / source), "-o", str(obj)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--arch",
        action="append",
        dest="archs",
        help="CUDA architecture (repeatable), e.g. 90 or 100a",
    )
    parser.add_argument(
        "--compile-only",
        action="store_true",
        help="compile the .cu sources to object files with nvcc (no GPU needed)",
    )
    parser.add_argument(
        "--cutlass-include", type=Path, help="CUTLASS include folder (default: the pinned wheel's)"
    )
    parser.add_argument(
        "--ptxas-verbose", action="store_true", help="print the sm_90a kernel's register use"
    )
    parser.add_argument("--build-dir", type=Path, help="CMake build folder (default: a temp dir)")
    parser.add_argument("--install-dir", type=Path, help="where the module is copied")
    args = parser.parse_args(argv)
    try:
        if args.compile_only:
            archs = args.archs or ["90", "100a"]
            with tempfile.TemporaryDirectory() as tmp:
                objects = compile_only(
                    archs,
                    args.build_dir or Path(tmp),
                    cutlass_include_dir=args.cutlass_include,
                    ptxas_verbose=args.ptxas_verbose,
                )
            extra = " (and the attention kernel for sm_90a)" if builds_sm90_attention(archs) else ""
            print(f"compiled {len(objects)} CUDA objects for sm_{', sm_'.join(archs)}{extra}")
            return 0
        if args.build_dir is None or args.install_dir is None:
            parser.error("--build-dir and --install-dir are needed unless --compile-only")
        print(build_extension(REPO_ROOT, args.build_dir, args.install_dir, args.archs))
        return 0
    except CMakeBuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
