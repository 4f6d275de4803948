"""What the build machine has: the CUDA version of its PyTorch, and nvcc."""

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional, Tuple

from . import pinned

CUDA_MAJOR_ENV = "NVTE_FORK_CUDA_MAJOR"
REQUIRE_EXT_ENV = "NVTE_FORK_REQUIRE_EXT"
SKIP_EXT_ENV = "NVTE_FORK_SKIP_EXT"

_PROBE = "import torch; print(torch.__version__, torch.version.cuda or '')"


class BuildEnvironmentError(RuntimeError):
    """The build machine lacks something the build needs."""


def detect_cuda_major() -> int:
    """The CUDA major version the core library must match: NVTE_FORK_CUDA_MAJOR, else torch's."""
    override = os.getenv(CUDA_MAJOR_ENV)
    if override:
        return _supported(override, f"{CUDA_MAJOR_ENV}={override}")
    torch_version, cuda = _probe_torch()
    if not cuda:
        raise BuildEnvironmentError(
            f"PyTorch {torch_version} is a CPU-only build: the fork needs a CUDA build of PyTorch"
            f" (CUDA {' or '.join(map(str, pinned.SUPPORTED_CUDA_MAJORS))}), or set"
            f" {CUDA_MAJOR_ENV} to choose the core library by hand."
        )
    return _supported(cuda.split(".")[0], f"torch {torch_version} (CUDA {cuda})")


def _supported(major: str, source: str) -> int:
    if not major.isdigit() or int(major) not in pinned.SUPPORTED_CUDA_MAJORS:
        choices = " or ".join(map(str, pinned.SUPPORTED_CUDA_MAJORS))
        raise BuildEnvironmentError(f"{source}: the CUDA major version must be {choices}")
    return int(major)


def _probe_torch() -> Tuple[str, str]:
    """(torch version, torch CUDA version or ""), from this interpreter's environment.

    Under pip's build isolation torch is not importable here, so the same interpreter is asked
    again without the isolation's PYTHONPATH, which sees the environment pip installs into.
    """
    try:
        import torch
    except ImportError:
        return _probe_torch_outside_build_env()
    return torch.__version__, torch.version.cuda or ""


def _probe_torch_outside_build_env() -> Tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    result = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise BuildEnvironmentError(
            "PyTorch is not installed: install a CUDA build of PyTorch first (the core library is"
            f" chosen by its CUDA version), or set {CUDA_MAJOR_ENV}=12 or 13."
        )
    version, _, cuda = result.stdout.strip().partition(" ")
    return version, cuda


def find_nvcc() -> Optional[Path]:
    """nvcc from CUDACXX, CUDA_HOME, CUDA_PATH, PATH or /usr/local/cuda; None if absent."""
    candidates = [os.getenv("CUDACXX")]
    candidates += [
        os.path.join(os.environ[v], "bin", "nvcc")
        for v in ("CUDA_HOME", "CUDA_PATH")
        if os.getenv(v)
    ]
    candidates += [shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def extension_required() -> bool:
    """NVTE_FORK_REQUIRE_EXT=1: a build without the CUDA extension is an error, not a warning."""
    return os.getenv(REQUIRE_EXT_ENV, "0") == "1"


def extension_skipped() -> bool:
    """NVTE_FORK_SKIP_EXT=1: build the Python package only, even where nvcc is present."""
    return os.getenv(SKIP_EXT_ENV, "0") == "1"
