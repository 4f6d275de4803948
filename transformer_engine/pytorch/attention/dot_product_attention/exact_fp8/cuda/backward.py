"""Mask-exact FP8 attention backward on the sm_90a CUDA kernels: the launcher.

    dq, dk, dv = exact_fp8_attention_backward(q, k, v, out, d_out, lse, recipe="current")

Same arguments, results and numerics as triton.backward.exact_fp8_attention_backward, for the
subset of the CUDA forward's calls it runs (bshd or sbhd, bf16 or fp16, d = 128, current
scaling, causal (top-left) or no mask, MHA or GQA; backward_supported decides: bottom-right
causal, padding masks, thd, sliding windows and d = 64 run the Triton backward). The kernels read V and dO and write the
gradients through their batch and sequence strides: an sbhd call passes the bshd views, no
copies. Q and K are quantized again by the forward's own casts (the forward's FP8 operands bit for
bit, Note [Mask-exact FP8 scaling]); D and LSE2 come from the Triton backward's preprocess kernel
and the dequantized bf16 copies of Q8 and K8 from its dequantize_rows_kernel; the CUDA kernel
reads the FP8 operands for the scores and the dequantized copies for dK and dQ, and adds dQ into
an fp32 accumulator in a fixed order (Note [Ordered dQ accumulation], backward_dq_accum.h), which
a second kernel stores as dq.
Design: docs/backward.md, "The sm90 CUDA backward".
"""

from typing import Optional, Tuple

import torch

from .. import quantize
from ..masks import bshd_view
from .attention import _DTYPE_CODES, kernel_view, unsupported_reason

__all__ = [
    "backward_of_supported",
    "backward_supported",
    "exact_fp8_attention_backward",
    "extension_has_backward",
]

_SYMBOL = "attention_sm90_bwd"
_TILE = 128  # rows and keys of the kernels' tiles (the padding of row values and K scales)
_ROW_BLOCK = 64  # query rows of a step: the dQ accumulator's blocks
_LOG2E = 1.4426950408889634


def extension_has_backward() -> bool:
    """Whether the extension was built with the sm_90a backward kernels."""
    return quantize._ext is not None and hasattr(quantize._ext, _SYMBOL)


# The masks of the CUDA backward, with the window sizes that mean no window under each.
_MASKS = {"causal": ((-1, -1), (-1, 0)), "no_mask": ((-1, -1),)}


def backward_supported(q, k, v, **kwargs) -> Optional[str]:
    """Why the CUDA backward does not run this call (the forward call's arguments), or None."""
    if not extension_has_backward():
        return "the extension was built without the sm_90a backward kernels"
    for name in ("launch_config", "unguarded"):
        if kwargs.get(name):
            return f"{name} belongs to the Triton backward"
    forward = {n: x for n, x in kwargs.items() if n not in ("launch_config", "unguarded")}
    # The forward runs the calls below too; their backward is the Triton kernels'.
    mask = forward.get("attn_mask_type", "causal")
    if mask not in _MASKS:
        return f"the CUDA backward runs {' and '.join(_MASKS)}, not {mask}"
    if forward.get("qkv_format") == "thd":
        return "the CUDA backward runs dense samples (bshd, sbhd), not thd"
    window = forward.get("window_size")
    if window is not None and tuple(window) not in _MASKS[mask]:
        return f"the CUDA backward runs no sliding window, got window_size {tuple(window)}"
    if q.shape[-1] != 128:
        return f"the CUDA backward runs d = 128, not d = {q.shape[-1]}"
    return unsupported_reason(q, k, v, **forward)


def exact_fp8_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    d_out: torch.Tensor,
    lse: torch.Tensor,
    **kwargs,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of mask-exact FP8 attention, contiguous, q's / k's / v's shapes.

    The keyword arguments are the forward call's; raises ValueError naming what the kernels do
    not run (backward_supported)."""
    reason = backward_supported(q, k, v, **kwargs)
    if reason is not None:
        raise ValueError(f"the sm90 CUDA attention backward does not run this call: {reason}")
    return backward_of_supported(q, k, v, out, d_out, lse, **kwargs)


def backward_of_supported(q, k, v, out, d_out, lse, **kwargs):
    """exact_fp8_attention_backward of a call backward_supported accepted (it does not check the
    call again: kernels.attention_backward has, once per call)."""
    from ..triton.backward import check_forward_outputs, dequantized_rows, row_statistics

    qkv_format = kwargs.get("qkv_format", "bshd")
    batch, s_q, heads, d = bshd_view(q, qkv_format).shape
    s_kv, heads_kv = bshd_view(k, qkv_format).shape[1], k.shape[2]
    check_forward_outputs(q, out, d_out, lse, batch * s_q)
    if batch * s_q == 0 or s_kv == 0:  # nothing to see: every gradient is 0
        return tuple(torch.zeros_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))
    # contiguous in the call's format; the kernels write their bshd views
    dq, dk, dv = (torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))
    softmax_scale = kwargs.get("softmax_scale")
    if softmax_scale is None:
        softmax_scale = d**-0.5
    cast = dict(
        qkv_format=qkv_format,
        use_power_2_scales=bool(kwargs.get("use_power_2_scales", False)),
        amax_epsilon=float(kwargs.get("amax_epsilon", 0.0)),
    )
    # See Note [Mask-exact FP8 scaling]: the forward's casts, so its operands bit for bit.
    q8, q_scale = quantize.per_token_cast_to_fp8(q, **cast)
    k8, k_scale = quantize.per_token_cast_to_fp8(k, **cast)
    q_dq, k_dq = (dequantized_rows(x8, s, q.dtype) for x8, s in ((q8, q_scale), (k8, k_scale)))

    delta, lse2 = row_statistics(
        q,
        k,
        out,
        d_out,
        lse,
        qkv_format=qkv_format,
        attn_mask_type=kwargs.get("attn_mask_type", "causal"),
    )
    rows = _row_values(q_scale, lse2, delta, batch, s_q, softmax_scale)
    keys = _padded(k_scale.view(heads_kv, batch, s_kv), 0.0)
    v, d_out = (kernel_view(bshd_view(x, qkv_format)) for x in (v, d_out))
    # the dQ accumulator and its counters, [h, b, row blocks, 64 * 128] fp32 and [h, b, row
    # blocks] int32 (scratch: the call zeroes the counters)
    row_blocks = -(-s_q // _ROW_BLOCK)
    dq_accum = torch.empty(heads * batch * row_blocks * _ROW_BLOCK * d, dtype=torch.float32,
                           device=q.device)  # fmt: skip
    dq_count = torch.empty(heads * batch * row_blocks, dtype=torch.int32, device=q.device)
    dq_b, dk_b, dv_b = (bshd_view(g, qkv_format) for g in (dq, dk, dv))
    quantize._launch(
        dq, quantize._ext.attention_sm90_bwd,
        q8.data_ptr(), q_dq.data_ptr(), k8.data_ptr(), k_dq.data_ptr(), keys.data_ptr(),
        v.data_ptr(), d_out.data_ptr(), rows.data_ptr(), dq.data_ptr(), dk.data_ptr(),
        dv.data_ptr(), batch, s_q, s_kv, heads, heads_kv, d,
        kwargs.get("attn_mask_type", "causal") == "causal", float(softmax_scale),
        v.stride(0), v.stride(1), d_out.stride(0), d_out.stride(1),
        dq_b.stride(0), dq_b.stride(1), dk_b.stride(0), dk_b.stride(1),
        dq_accum.data_ptr(), dq_count.data_ptr(), _DTYPE_CODES[q.dtype],
    )  # fmt: skip
    return dq, dk, dv


def _padded(x: torch.Tensor, fill: float) -> torch.Tensor:
    """[..., s] fp32 -> [..., s rounded up to _TILE], `fill` past s."""
    s = x.shape[-1]
    out = x.new_full((*x.shape[:-1], -(-s // _TILE) * _TILE), fill, dtype=torch.float32)
    out[..., :s] = x
    return out


def _to_fp32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def _scale_log2(softmax_scale: float) -> float:
    """The CUDA forward's fp32 softmax_scale * log2(e): the C API takes softmax_scale in fp32 and
    multiplies it in double (launcher.cu), rounded to fp32 once."""
    return _to_fp32(_to_fp32(softmax_scale) * _LOG2E)


def _row_values(q_scale, lse2, delta, batch, s_q, softmax_scale) -> torch.Tensor:
    """[3, h, b, rows_pad] fp32: the forward's row scale (q_scale * fp32(softmax_scale *
    log2 e), the CUDA forward's product), LSE2 and D of every row; (1, +inf, 0) past s_q."""
    heads = q_scale.shape[0]
    rows = q_scale.new_empty(3, heads, batch, -(-s_q // _TILE) * _TILE)
    for i, (x, fill) in enumerate(
        ((q_scale * _scale_log2(softmax_scale), 1.0), (lse2, float("inf")), (delta, 0.0))
    ):
        rows[i, :, :, :s_q] = x.view(heads, batch, s_q)
        rows[i, :, :, s_q:] = fill
    return rows
