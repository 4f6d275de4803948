"""Backend selection for FP8 DotProductAttention when the recipe asks for mask-exact FP8 attention.

DotProductAttention.forward calls `dispatch(self, attention_params)` once its inputs are checked
and its AttentionParams are built (patch 0003). Then, when the QKV recipe asks for mask-exact FP8
attention (recipe.mask_exact_recipe):

  * a request that cannot be mask-exact is an error that says why (`check_request`): fp8_mha,
    fp8_output, or Q/K/V that arrive already quantized (their scales were computed outside the
    attention, over all tokens);
  * a configuration the mask-exact kernels support runs them (`Dispatch.run`, te/autograd.py);
  * any other configuration runs upstream's BF16/FP16 attention: the AttentionParams handed back
    have fp8=False, and the reason is logged at debug level ("Disabling mask-exact FP8 attention
    for ..."), or as a warning, once per process, when a dependency is missing (Triton, the CUDA
    extension; te/status.py). It never falls back to upstream's FP8 attention, whose scales leak
    across the mask.

Every call that asked is recorded in te/status.py (`status.status()`: mask-exact calls, fallbacks
by reason, the last kernel backend). `mask_exact_decision` answers the same question from the
AttentionParams alone, without recording anything; te/selection.py uses it to report the
mask-exact backend from upstream's get_attention_backend (patch 0005).

Without the request, upstream's selection runs unchanged. This module imports no part of TE at
import time: `unsupported_reason`, `check_request` and `mask_exact_decision` (given the device
support) are pure and tested on CPU.
"""

import dataclasses
import functools
import logging
from typing import Any, Optional, Tuple

import torch

from .. import kernels, quantize
from ..masks import MASK_TYPES
from . import status
from .recipe import kernel_recipe, mask_exact_recipe

__all__ = [
    "MIN_COMPUTE_CAPABILITY",
    "Decision",
    "Dispatch",
    "dispatch",
    "mask_exact_decision",
    "check_request",
    "unsupported_reason",
    "qkv_formats",
]

MIN_COMPUTE_CAPABILITY = (8, 9)
"""FP8 tensor cores (Ada, Hopper, Blackwell)."""

_DTYPES = (torch.bfloat16, torch.float16)
_NON_CAUSAL_MASKS = ("no_mask", "padding")
_DISABLED = status.DISABLED


@functools.lru_cache(maxsize=128)
def qkv_formats(qkv_layout: str) -> Tuple[str, str]:
    """(q format, kv format) of a TE qkv_layout, e.g. "sbhd_sb2hd" -> ("sbhd", "sbhd").
    Cached: TE has a few dozen layouts, and every call asks."""
    parts = qkv_layout.replace("3", "").replace("2", "").split("_")
    if parts[0] == "paged":
        parts = parts[2:]
    return parts[0], parts[-1]


def check_request(recipe: Any, params: Any, qkv_quantized: bool) -> None:
    """Raise ValueError for a request that mask-exact FP8 attention must refuse.

    recipe: the QKV recipe (recipe.mask_exact_recipe); params: DotProductAttention's
    AttentionParams (fp8_meta, fp8_output); qkv_quantized: Q, K, V arrived as FP8 tensors.
    """
    off = (
        " Set fp8_dpa_mask_exact=False in the recipe (or NVTE_FP8_DPA_MASK_EXACT=0 before importing"
        " transformer_engine) for upstream's FP8 attention, which is not mask-exact."
    )
    if recipe.fp8_mha or params.fp8_meta["recipe"].fp8_mha:
        raise ValueError(
            "fp8_mha=True cannot be mask-exact: the QKV projection's FP8 output would be quantized"
            " with one amax over all tokens of the batch, so a future, padded or other-sample token"
            " would change every token's Q, K and V (and the FP8 attention output handed to the"
            " output projection has the same problem). Use fp8_mha=False: mask-exact FP8 attention"
            " then quantizes Q, K and V itself and returns a BF16/FP16 output." + off
        )
    if params.fp8_output:
        raise ValueError(
            "fp8_output=True cannot be mask-exact: an FP8 attention output is quantized with scales"
            " that reduce over all tokens, so a masked token would change the output." + off
        )
    if qkv_quantized:
        raise ValueError(
            "Mask-exact FP8 attention takes BF16/FP16 query, key and value tensors: these arrived"
            " already quantized, with scales computed outside the attention over all tokens"
            " (see Note [Mask-exact FP8 scaling])." + off
        )


def unsupported_reason(
    params: Any,
    *,
    compute_capability: Tuple[int, int],
    head_dims: Tuple[int, ...],
    triton_available: bool,
    onnx_export: bool = False,
    extension_available: bool = True,
) -> Optional[str]:
    """Why the mask-exact kernels cannot run this call, or None when they can.

    params: DotProductAttention's AttentionParams (any object with its attributes); head_dims:
    the kernels' head dims (attention.HEAD_DIMS); extension_available: the CUDA extension
    transformer_engine_exact_fp8 (the K/V quantization) imports; without it every call would
    quantize through the CPU reference. The first failed check is the reason.
    """
    # One check after the other, each message formatted only when its check fails: this runs
    # on every DotProductAttention call that asks for mask-exact FP8 attention.
    if not triton_available:
        return status.TRITON_MISSING
    if tuple(compute_capability) < MIN_COMPUTE_CAPABILITY:
        return "compute capability sm%d%d (FP8 tensor cores need sm89 or newer)" % tuple(
            compute_capability
        )
    if onnx_export:
        return "ONNX export"
    if not extension_available:
        return status.EXTENSION_MISSING
    if params.qkv_dtype not in _DTYPES:
        return f"qkv_dtype={params.qkv_dtype} (bf16 and fp16 only)"
    if params.head_dim_qk != params.head_dim_v or params.head_dim_qk not in head_dims:
        return (
            f"head_dim_qk={params.head_dim_qk}, head_dim_v={params.head_dim_v}"
            f" (equal head dims in {tuple(head_dims)} only)"
        )
    if params.attn_mask_type not in MASK_TYPES:
        return f"attn_mask_type={params.attn_mask_type!r} (no geometry to split V scales at)"
    window = params.window_size if params.window_size is not None else (-1, -1)
    if (
        params.attn_mask_type in _NON_CAUSAL_MASKS
        and max(window) >= 0
        and not params.bottom_right_diagonal
    ):
        return (
            f"a top-left aligned sliding window with attn_mask_type={params.attn_mask_type!r}"
            " (the kernels align the windows of non-causal masks bottom-right)"
        )
    q_format, kv_format = qkv_formats(params.qkv_layout)
    if q_format != kv_format:
        return f"qkv_layout={params.qkv_layout!r} (q and kv formats differ)"
    if params.inference_params is not None:
        return "KV caching (inference_params)"
    if params.context_parallel:
        return "context parallelism"
    if params.core_attention_bias_type != "no_bias":
        return f"core_attention_bias_type={params.core_attention_bias_type!r}"
    if params.softcap > 0.0:
        return f"softcap={params.softcap}"
    if params.softmax_type != "vanilla":
        return f"softmax_type={params.softmax_type!r}"
    if params.is_training and params.attention_dropout > 0.0:
        return f"attention_dropout={params.attention_dropout} in training"
    if params.return_max_logit:
        return "return_max_logit=True"
    if params.has_score_mod:
        return "score_mod"
    return None


@dataclasses.dataclass
class Dispatch:
    """The outcome of `dispatch` for one DotProductAttention.forward call.

    attention_params: what upstream's backend selection gets (fp8=False where mask-exact FP8
    attention was asked for but cannot run). recipe: the kernels' recipe ("current", "mxfp8")
    when the mask-exact kernels run this call, else None.
    """

    attention_params: Any
    recipe: Optional[str] = None
    use_power_2_scales: bool = False
    logger: Any = None

    @property
    def runs(self) -> bool:
        """Does this call run the mask-exact kernels (else upstream's selection runs)?"""
        return self.recipe is not None

    def run(self, q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded):
        """Mask-exact FP8 attention; returns the output as DotProductAttention does, [..., h * d]."""
        from .autograd import AttentionCall, MaskExactFP8AttentionFunc

        params = self.attention_params
        needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
        call = AttentionCall(
            recipe=self.recipe,
            use_power_2_scales=self.use_power_2_scales,
            qkv_format=qkv_formats(params.qkv_layout)[0],
            attn_mask_type=params.attn_mask_type,
            window_size=tuple(params.window_size),
            softmax_scale=params.softmax_scale,
            max_seqlen_q=params.max_seqlen_q,
            max_seqlen_kv=params.max_seqlen_kv,
            requires_grad=needs_grad,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv,
            cu_seqlens_q_padded=cu_seqlens_q_padded,
            cu_seqlens_kv_padded=cu_seqlens_kv_padded,
        )
        out = MaskExactFP8AttentionFunc.apply(q, k, v, call)
        status.record_run(kernels.last_backend(), self.recipe, self.logger or _LOGGER)
        return out.view(*out.shape[:-2], -1)


_LOGGER = logging.getLogger("DotProductAttention")  # TE's logger of DotProductAttention


@dataclasses.dataclass(frozen=True)
class Decision:
    """How the fork runs one configuration (its AttentionParams), before anything runs.

    recipe: the QKV recipe when it asks for mask-exact FP8 attention, else None (then upstream's
    selection runs unchanged). kernel_recipe: "current" or "mxfp8" when the mask-exact kernels
    run it. reason: why not, when asked but BF16/FP16 attention runs instead."""

    recipe: Any = None
    kernel_recipe: Optional[str] = None
    reason: Optional[str] = None

    @property
    def asked(self) -> bool:
        return self.recipe is not None

    @property
    def runs(self) -> bool:
        return self.kernel_recipe is not None


def _decide(recipe: Any, params: Any, device_support: Optional[dict]) -> Decision:
    if recipe is None:
        return Decision()
    check_request(recipe, params, _is_quantized(params.qkv_type))
    support = _device_support() if device_support is None else device_support
    reason = unsupported_reason(params, **support)
    if reason is not None:
        return Decision(recipe=recipe, reason=reason)
    return Decision(recipe=recipe, kernel_recipe=kernel_recipe(recipe))


def mask_exact_decision(
    params: Any, *, device_support: Optional[dict] = None, logger: Any = None
) -> Decision:
    """Does the fork run this configuration mask-exact, and if not, why? Records nothing.

    params: DotProductAttention's AttentionParams (its fp8 and fp8_meta say what is asked for);
    device_support: unsupported_reason's keyword arguments (default: this machine's). Raises
    ValueError, as DotProductAttention.forward would, for a request the fork refuses."""
    recipe = mask_exact_recipe(params.fp8, params.fp8_meta)
    del logger  # kept for callers: the decision logs nothing
    return _decide(recipe, params, device_support)


def dispatch(dpa: Any, attention_params: Any) -> Dispatch:
    """Decide how one DotProductAttention.forward call runs; see the module doc."""
    recipe = mask_exact_recipe(dpa.fp8, dpa.fp8_meta)
    decision = _decide(recipe, attention_params, None)
    if not decision.asked:
        return Dispatch(attention_params)
    if not decision.runs:
        status.record_fallback(decision.reason, dpa.logger)
        return Dispatch(dataclasses.replace(attention_params, fp8=False))
    return Dispatch(
        attention_params,
        recipe=decision.kernel_recipe,
        use_power_2_scales=bool(getattr(recipe, "use_power_2_scales", False)),
        logger=dpa.logger,
    )


def _is_quantized(qkv_type: type) -> bool:
    if qkv_type is torch.Tensor:
        return False
    from transformer_engine.pytorch.quantized_tensor import QuantizedTensorStorage

    return issubclass(qkv_type, QuantizedTensorStorage)


@functools.lru_cache(maxsize=None)
def _compute_capability(device: int) -> Tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def _device_support() -> dict:
    """unsupported_reason's keyword arguments that describe this machine and process."""
    return dict(_static_support(torch.cuda.current_device()), onnx_export=_onnx_export())


@functools.lru_cache(maxsize=None)
def _static_support(device: int) -> dict:
    """The part of _device_support that cannot change in a process, per device: the Triton
    backend's availability (itself cached) and head dims, the compute capability and the
    extension (imported once). Read-only: _device_support copies it."""
    # The Triton kernel runs every configuration the fork supports; the CUDA kernel a subset
    # (kernels.choose_backend), so the Triton backend's needs decide.
    triton_available = kernels.backend_available("triton")
    return dict(
        compute_capability=_compute_capability(device),
        head_dims=kernels.head_dims("triton") if triton_available else (),
        triton_available=triton_available,
        extension_available=quantize.extension_available(),
    )


_IS_ONNX_EXPORT = []  # TE's is_in_onnx_export_mode, imported on first use


def _onnx_export() -> bool:
    if not _IS_ONNX_EXPORT:
        from transformer_engine.pytorch.export import is_in_onnx_export_mode

        _IS_ONNX_EXPORT.append(is_in_onnx_export_mode)
    return _IS_ONNX_EXPORT[0]()
