"""The kernel backends of mask-exact FP8 attention, and the one function that chooses among them.

    out, lse = attention_forward(q, k, v, recipe="current", attn_mask_type="causal")

Every caller of the production path (TE's autograd function, the causality audit's kernel mode,
the benchmarks) runs the forward through `attention_forward`; none imports a backend's launcher
itself. Backends (each a folder of this package):

  "triton"  triton/: the Triton kernel and its launcher, for every GPU Triton runs FP8 on (sm89+).

`select_backend` is where a backend is chosen; a backend that cannot run a call never hands it to
a leaky path (see Note [Mask-exact FP8 scaling] in formats.py).
"""

import functools
import importlib.util
from typing import Tuple

import torch

__all__ = ["BACKENDS", "attention_forward", "backend_available", "head_dims", "select_backend"]

BACKENDS = ("triton",)


@functools.lru_cache(maxsize=None)
def backend_available(backend: str) -> bool:
    """Whether `backend`'s dependencies are installed (not whether a GPU is present)."""
    _check_backend(backend)
    return importlib.util.find_spec("triton") is not None


def select_backend() -> str:
    """The kernel backend for the next call."""
    return "triton"


def head_dims(backend: str) -> Tuple[int, ...]:
    """The head dims `backend` runs."""
    _check_backend(backend)
    from .triton.attention import HEAD_DIMS

    return HEAD_DIMS


def attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Mask-exact FP8 attention forward on the selected backend: (out, lse).

    q, k, v and the keyword arguments as triton.attention.exact_fp8_attention_forward takes them;
    out has q's shape and dtype, lse is fp32 [h, t_q] (natural log, -inf for a row that sees
    nothing)."""
    backend = select_backend()
    if backend == "triton":
        from .triton.attention import exact_fp8_attention_forward

        return exact_fp8_attention_forward(q, k, v, **kwargs)
    raise AssertionError(f"no launcher for backend {backend!r}")


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
