"""The pinned upstream Transformer Engine release the fork is built from.

Every artifact is identified by its exact PyPI file name and sha256; nothing else is trusted.
"""

from dataclasses import dataclass
from typing import Dict, List, Tuple

UPSTREAM_VERSION = "2.20.2"
PACKAGE = "transformer_engine"
SUPPORTED_CUDA_MAJORS: Tuple[int, ...] = (12, 13)


@dataclass(frozen=True)
class Artifact:
    """One pinned file of a PyPI project."""

    project: str
    filename: str
    sha256: str
    version: str = UPSTREAM_VERSION

    @property
    def requirement(self) -> str:
        """The pip requirement that resolves to this artifact's release."""
        return f"{self.project}=={self.version}"

    @property
    def is_sdist(self) -> bool:
        return self.filename.endswith(".tar.gz")

    @property
    def platform_tag(self) -> str:
        """The wheel's platform tag ("any" for pure wheels, "" for sdists)."""
        if self.is_sdist:
            return ""
        return self.filename[: -len(".whl")].rsplit("-", 1)[1]


# The pure-Python package: transformer_engine/{common,pytorch,jax,debug}/... (the tree we patch).
PURE_PYTHON_WHEEL = Artifact(
    "transformer_engine",
    "transformer_engine-2.20.2-py3-none-any.whl",
    "7dcfad943a1a55b2612db9a0e43697fe98c70f4c42ec391ba3a0f872f6ce2094",
)

# The PyTorch extension (transformer_engine_torch), built from source by pip.
TORCH_SDIST = Artifact(
    "transformer_engine_torch",
    "transformer_engine_torch-2.20.2.tar.gz",
    "4c40ced8a6261649e689076f198d4feaf02277b1ba18931a66eccdaceb33c43e",
)

# The core library (libtransformer_engine.so), one wheel per CUDA major version. Each also ships
# an unpatched copy of the Python tree; see docs/building.md ("Install order").
CORE_WHEELS: Dict[int, Artifact] = {
    12: Artifact(
        "transformer_engine_cu12",
        "transformer_engine_cu12-2.20.2-py3-none-manylinux_2_28_x86_64.whl",
        "7e745539686166790cb9fe2133e7c187edf6fe8627c7f7d46597888299c3f4cf",
    ),
    13: Artifact(
        "transformer_engine_cu13",
        "transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl",
        "30063d3699e779cce63617c3458804f7a504ce8279f2749c98313db9daae273e",
    ),
}

ALL_ARTIFACTS: Tuple[Artifact, ...] = (PURE_PYTHON_WHEEL, TORCH_SDIST, *CORE_WHEELS.values())

# Build-time only: the CuTe/CUTLASS headers of the sm90 attention kernel, from NVIDIA's
# `nvidia-cutlass` wheel (headers under CUTLASS_INCLUDE_PREFIX inside it). Never installed, never
# copied into the repository: build_tools.fetch.cutlass_include_dir unpacks them into the cache.
CUTLASS_VERSION = "4.2.0.0"
CUTLASS_WHEEL = Artifact(
    "nvidia_cutlass",
    "nvidia_cutlass-4.2.0.0-py3-none-any.whl",
    "f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6",
    version=CUTLASS_VERSION,
)
CUTLASS_INCLUDE_PREFIX = "cutlass_library/source/include/"
BUILD_ARTIFACTS: Tuple[Artifact, ...] = (CUTLASS_WHEEL,)


def core_wheel(cuda_major: int) -> Artifact:
    """The core-library wheel for a CUDA major version."""
    if cuda_major not in CORE_WHEELS:
        raise ValueError(
            f"CUDA {cuda_major} is not supported: Transformer Engine {UPSTREAM_VERSION} ships core"
            f" libraries for CUDA {' and '.join(map(str, SUPPORTED_CUDA_MAJORS))} only."
        )
    return CORE_WHEELS[cuda_major]


def install_artifacts(cuda_major: int) -> Tuple[Artifact, ...]:
    """Every pinned artifact an install for `cuda_major` consumes."""
    return (PURE_PYTHON_WHEEL, TORCH_SDIST, core_wheel(cuda_major))


def install_requirements(cuda_major: int) -> List[str]:
    """The fork's runtime requirements on upstream's binary packages."""
    return [core_wheel(cuda_major).requirement, TORCH_SDIST.requirement]


def by_filename(filename: str) -> Artifact:
    """Look an artifact up by its exact file name."""
    for artifact in ALL_ARTIFACTS + BUILD_ARTIFACTS:
        if artifact.filename == filename:
            return artifact
    known = ", ".join(a.filename for a in ALL_ARTIFACTS + BUILD_ARTIFACTS)
    raise KeyError(f"{filename} is not a pinned artifact (pinned: {known})")
