"""The kernel backends of mask-exact FP8 attention, and the functions that choose among them.

    out, lse = attention_forward(q, k, v, recipe="current", attn_mask_type="causal")
    dq, dk, dv = attention_backward(q, k, v, out, d_out, lse, recipe="current", ...)

Every caller of the production path (TE's autograd function, the causality audit's kernel mode,
the benchmarks) runs the forward through `attention_forward` and the backward through
`attention_backward`; none imports a backend's launcher itself. Backends (each a folder of this
package):

  "triton"  triton/: the Triton kernels and their launchers, for every GPU Triton runs FP8 on
            (sm89+): the forward, and the backward of every call (docs/backward.md).
  "cuda"    cuda/: the CUDA C++ (CuTe) forward and backward kernels for sm90
            (docs/attention_kernel_sm90.md, docs/backward.md): the forward of bshd, sbhd and
            thd, bf16 and fp16, d = 64 and 128, current scaling, every mask type and sliding
            window; the backward of its dense d = 128 causal and no-mask calls.

Which backend runs a call (`choose_backend`): NVTE_FP8_DPA_MASK_EXACT_BACKEND = "triton" or
"cuda" forces one (a forced "cuda" raises ValueError for what it does not run); unset or "auto",
the CUDA kernel runs every call it supports on an sm90 GPU whose extension holds it, and the
Triton kernel runs the rest (a debug line on TE's DotProductAttention logger names why). No
backend hands a call it cannot run to a leaky path (Note [Mask-exact FP8 scaling], formats.py).
"""

import functools
import importlib.util
import logging
import os
from typing import Optional, Tuple

import torch

__all__ = [
    "BACKENDS",
    "BACKEND_ENV",
    "attention_backward",
    "attention_forward",
    "backend_available",
    "choose_backend",
    "choose_backward_backend",
    "device_capability",
    "head_dims",
    "last_backend",
    "select_backend",
]

BACKENDS = ("triton", "cuda")
BACKEND_ENV = "NVTE_FP8_DPA_MASK_EXACT_BACKEND"
_LOGGER = logging.getLogger("DotProductAttention")  # TE's logger of backend selection
_last = {"backend": None}  # the backend of the last attention_forward call in this process
_UNREAD = "unread"  # select_backend's default: read the environment


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


def _forced_backend() -> Optional[str]:
    """The backend NVTE_FP8_DPA_MASK_EXACT_BACKEND forces, or None ("auto" or unset)."""
    value = os.environ.get(BACKEND_ENV, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV} must be one of auto, {', '.join(BACKENDS)}; got {value!r}")
    return value


def select_backend(forced: Optional[str] = _UNREAD) -> str:
    """The preferred kernel backend of this process: the forced one, else "cuda" where its
    kernel can run here, else "triton". A call the CUDA kernel does not support still runs the
    Triton kernel (choose_backend). forced: _forced_backend() when the caller has read it."""
    if forced is _UNREAD:
        forced = _forced_backend()
    if forced is not None:
        return forced
    return "cuda" if backend_available("cuda") else "triton"


def choose_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> str:
    """The backend that runs this call (the module doc says how it is chosen)."""
    return _choose(q, k, v, kwargs)[0]


def _choose(q, k, v, kwargs) -> Tuple[str, bool]:
    """(backend, whether the CUDA kernel's checks accepted the call)."""
    forced = _forced_backend()  # the environment read once per call
    preferred = select_backend(forced)
    if preferred != "cuda" or forced == "cuda":
        return preferred, False
    from .cuda.attention import unsupported_reason

    reason = unsupported_reason(q, k, v, **kwargs)
    if reason is None:
        return "cuda", True
    _LOGGER.debug("Disabling the CUDA kernel of mask-exact FP8 attention: %s", reason)
    return "triton", False


def last_backend() -> Optional[str]:
    """The backend that ran the last attention_forward call of this process (None before)."""
    return _last["backend"]


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
    """Mask-exact FP8 attention forward on `backend` (default: choose_backend): (out, lse).

    q, k, v and the keyword arguments as triton.attention.exact_fp8_attention_forward takes them;
    out has q's shape and dtype, lse is fp32 [h, t_q] (natural log, -inf for a row that sees
    nothing). The "cuda" backend raises ValueError for what it does not run yet."""
    checked = False
    if backend is None:
        backend, checked = _choose(q, k, v, kwargs)
    _check_backend(backend)
    _last["backend"] = backend
    # Imported per call (a dict lookup once loaded), so that a launcher patched by a test or a
    # tool is the one that runs.
    if checked:  # the CUDA kernel's checks accepted the call: not made twice
        from .cuda.attention import forward_supported

        return forward_supported(q, k, v, **kwargs)
    if backend == "cuda":
        from .cuda.attention import exact_fp8_attention_forward
    else:
        from .triton.attention import exact_fp8_attention_forward
    return exact_fp8_attention_forward(q, k, v, **kwargs)


def attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    d_out: torch.Tensor,
    lse: torch.Tensor,
    *,
    backend: Optional[str] = None,
    **kwargs,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of mask-exact FP8 attention from the forward's out and lse (any
    backend: they share the numerics). The keyword arguments are the forward call's, as
    triton.backward.exact_fp8_attention_backward takes them. `backend` (default:
    choose_backward_backend): "cuda" runs the sm90 CUDA backward (the forward's subset; raises
    ValueError for the rest), "triton" the Triton backward (every call)."""
    checked = False
    if backend is None:
        backend, checked = _choose_backward(q, k, v, kwargs)
    _check_backend(backend)
    if checked:  # the CUDA backward's checks accepted the call: not made twice
        from .cuda.backward import backward_of_supported

        return backward_of_supported(q, k, v, out, d_out, lse, **kwargs)
    if backend == "cuda":
        from .cuda.backward import exact_fp8_attention_backward
    else:
        from .triton.backward import exact_fp8_attention_backward
    return exact_fp8_attention_backward(q, k, v, out, d_out, lse, **kwargs)


def choose_backward_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> str:
    """The backend of a backward call, chosen as choose_backend chooses the forward's: the CUDA
    kernels for every call they support where the CUDA backend is preferred (a debug line names
    why not), the Triton kernels otherwise. A forced "cuda" runs the CUDA backward, which raises
    for what it does not support."""
    return _choose_backward(q, k, v, kwargs)[0]


def _choose_backward(q, k, v, kwargs) -> Tuple[str, bool]:
    """(backend, whether the CUDA backward's checks accepted the call)."""
    forced = _forced_backend()
    preferred = select_backend(forced)
    if preferred != "cuda" or forced == "cuda":
        return preferred, False
    from .cuda.backward import backward_supported

    reason = backward_supported(q, k, v, **kwargs)
    if reason is None:
        return "cuda", True
    _LOGGER.debug("Disabling the CUDA backward of mask-exact FP8 attention: %s", reason)
    return "triton", False


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
