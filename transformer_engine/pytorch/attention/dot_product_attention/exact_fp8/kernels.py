"""The kernel backends of mask-exact FP8 attention, and the one function that chooses among them.

    out, lse = attention_forward(q, k, v, recipe="current", attn_mask_type="causal")

Every caller of the production path (TE's autograd function, the causality audit's kernel mode,
the benchmarks) runs the forward through `attention_forward`; none imports a backend's launcher
itself. Backends (each a folder of this package):

  "triton"  triton/: the Triton kernel and its launcher, for every GPU Triton runs FP8 on (sm89+).
  "cuda"    cuda/: the CUDA C++ (CuTe) kernel for sm90, bshd / bf16 / d = 128 / current scaling /
            causal or no mask so far. Not yet run on hardware: select_backend never picks it;
            callers ask for it by name (attention_forward(..., backend="cuda")), as its tests do.

`select_backend` is where a backend is chosen; a backend that cannot run a call never hands it to
a leaky path (see Note [Mask-exact FP8 scaling] in formats.py).
"""

import functools
import importlib.util
from typing import Optional, Tuple

import torch

__all__ = [
    "BACKENDS", "attention_forward", "backend_available", "device_capability", "head_dims",
    "select_backend",
]  # fmt: skip

BACKENDS = ("triton", "cuda")


@functools.lru_cache(maxsize=None)
def backend_available(backend: str) -> bool:
    """Whether `backend` can run here.

    "triton": its dependencies are installed (not whether a GPU is present). "cuda": the
    extension holds the sm_90a attention kernel AND the current GPU is an sm90 one.
    """
    _check_backend(backend)
    if backend == "cuda":
        from .cuda.attention import extension_has_kernel

        if not extension_has_kernel() or not torch.cuda.is_available():
            return False
        return torch.cuda.get_device_capability() == (9, 0)
    return importlib.util.find_spec("triton") is not None


def device_capability(device: torch.device) -> Tuple[int, int]:
    """torch.cuda.get_device_capability of a CUDA device, cached per device index (it does not
    change in a process; torch's query costs a few microseconds of host time per call)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _device_capability(index)


@functools.lru_cache(maxsize=None)
def _device_capability(index: int) -> Tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def select_backend() -> str:
    """The kernel backend for the next call (the "cuda" backend is never chosen by default yet)."""
    return "triton"


def head_dims(backend: str) -> Tuple[int, ...]:
    """The head dims `backend` runs."""
    _check_backend(backend)
    if backend == "cuda":
        from .cuda.attention import HEAD_DIMS
    else:
        from .triton.attention import HEAD_DIMS

    return HEAD_DIMS


def attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, backend: Optional[str] = None, **kwargs
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Mask-exact FP8 attention forward on `backend` (default: select_backend()): (out, lse).

    q, k, v and the keyword arguments as triton.attention.exact_fp8_attention_forward takes them;
    out has q's shape and dtype, lse is fp32 [h, t_q] (natural log, -inf for a row that sees
    nothing). The "cuda" backend raises ValueError for what it does not run yet."""
    launcher = _LAUNCHERS.get(select_backend() if backend is None else backend)
    if launcher is None:
        launcher = _launcher(select_backend() if backend is None else backend)
    return launcher(q, k, v, **kwargs)


_LAUNCHERS = {}  # backend -> its exact_fp8_attention_forward, imported on first use


def _launcher(backend: str):
    _check_backend(backend)
    if backend == "triton":
        from .triton.attention import exact_fp8_attention_forward
    elif backend == "cuda":
        from .cuda.attention import exact_fp8_attention_forward
    else:
        raise AssertionError(f"no launcher for backend {backend!r}")
    _LAUNCHERS[backend] = exact_fp8_attention_forward
    return exact_fp8_attention_forward


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
