"""Mask-exact FP8 attention backward: the launcher of the kernels in backward_kernel.py.

    dq, dk, dv = exact_fp8_attention_backward(q, k, v, out, d_out, lse, recipe="current",
                                              attn_mask_type="causal")

out and lse are the forward's (triton.attention.exact_fp8_attention_forward, or any kernel
backend with the same numerics). Q and K are quantized again here, by the forward's own rules and
quantizer (quantize.py: the same bits as the forward's operands, see docs/backward.md), into the
token-major FP8 layouts the kernels read; V and dO enter unquantized. Design, numerics and costs:
docs/backward.md; the straight-through estimate: Note [Backward of the FP8 forward] in
te/autograd.py.
"""

from typing import Optional, Tuple

import torch
import triton

from ..sequences import sequences
from .attention import _check_inputs, _d_contiguous, _layout_strides, _quantize_k
from .backward_kernel import (
    backward_dkdv_kernel,
    backward_dq_kernel,
    backward_preprocess_kernel,
    dequantize_rows_kernel,
)
from .masking import UNBOUNDED
from ..formats import e8m0_to_float

__all__ = [
    "exact_fp8_attention_backward",
    "check_forward_outputs",
    "dequantized_rows",
    "row_statistics",
    "LAUNCH_CONFIG",
]

_TOP_LEFT_MASKS = ("causal", "padding_causal")
PREPROCESS_BLOCK_M = 64

# (dkdv (BM, BN, num_warps, num_stages), dq (BM, BN, num_warps, num_stages)) per (recipe, head
# dim). Unlike the forward's block_m, these change the order of the sums (the bits of the
# gradients, never what the mask hides): constants, never tuned at run time. The dK/dV program
# holds BN = 128 keys (two fp32 [128, d] accumulators over 8 warps: 128 registers a thread at
# d = 128) and steps over BM query rows; the dQ program holds 128 rows and steps over BN keys.
# Each is the largest step whose offline sm_90a compile (Triton 3.6) spills no register
# (docs/backward.md has the table: at d = 128 the 64-row dK/dV step of FlashAttention-2's
# layout spills 88 bytes for current scaling), except MXFP8 at d = 128, which takes the step
# measured faster on the H200 (32-row dK/dV, 64-key dQ: 9.65 against 12.72 ms at s = 8k for the
# spill-free 16-row / 32-key step; benchmarks/results/backward_h200.md);
# benchmarks/attention/bench_backward.py times alternatives on the GPU.
LAUNCH_CONFIG = {
    ("current", 64): ((64, 128, 8, 3), (128, 64, 8, 3)),
    ("current", 128): ((32, 128, 8, 3), (128, 64, 8, 2)),
    ("mxfp8", 64): ((32, 128, 8, 3), (128, 64, 8, 3)),
    ("mxfp8", 128): ((32, 128, 8, 2), (128, 64, 8, 2)),
}


def exact_fp8_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    d_out: torch.Tensor,
    lse: torch.Tensor,
    *,
    recipe: str,
    qkv_format: str = "bshd",
    attn_mask_type: str = "causal",
    window_size: Optional[Tuple[int, int]] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_kv: Optional[torch.Tensor] = None,
    cu_seqlens_q_padded: Optional[torch.Tensor] = None,
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    softmax_scale: Optional[float] = None,
    use_power_2_scales: bool = False,
    amax_epsilon: float = 0.0,
    launch_config=None,
    unguarded: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of mask-exact FP8 attention, in the shapes and dtype of q, k, v
    (contiguous).

    q, k, v and the keyword arguments as exact_fp8_attention_forward takes them (the same call's);
    out [q's shape] and lse [h, t_q] fp32 are the forward's outputs; d_out has out's shape.
    Positions past a sequence's real length (and thd gaps and tokens after the last sequence)
    get zero gradients; so do rows that see no key. Deterministic.

    thd: max_seqlen_q and max_seqlen_kv (at least the longest real sequences) size the grids;
    each absent one is computed from cu_seqlens with a host sync. Like the forward, the launcher
    then reads no offsets on the host (CUDA graphs can capture it).

    launch_config: ((BM, BN, warps, stages) of dK/dV, (BM, BN, warps, stages) of dQ) instead of
    LAUNCH_CONFIG's, for tests and benchmarks (the bits change with the block sizes).
    unguarded=True is the LEAKY emulation of the backward this replaced (backward_kernel's
    GUARDS=False), for negative controls only: never use it for results.
    """
    _check_inputs(q, k, v, recipe, qkv_format, attn_mask_type, window_size)
    t_q = q.shape[0] if qkv_format == "thd" else q.shape[0] * q.shape[1]
    check_forward_outputs(q, out, d_out, lse, t_q)
    if recipe == "mxfp8" and (use_power_2_scales or amax_epsilon != 0.0):
        raise ValueError("use_power_2_scales and amax_epsilon belong to current scaling only")
    seqs = sequences(
        q, k, qkv_format, attn_mask_type, cu_seqlens_q, cu_seqlens_kv,
        cu_seqlens_q_padded, cu_seqlens_kv_padded, max_seqlen_q,
    )  # fmt: skip
    span_kv = seqs.span_kv if not seqs.varlen else _max_seqlen(seqs.cu_kv, max_seqlen_kv, "kv")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    # See Note [Mask-exact FP8 scaling]: per-token scales, the forward's operands bit for bit.
    q8, q_scale = _quantize_k(q, qkv_format, recipe, use_power_2_scales, amax_epsilon)
    k8, k_scale = _quantize_k(k, qkv_format, recipe, use_power_2_scales, amax_epsilon)
    if recipe == "mxfp8":  # the kernels read fp32 powers of two (exact), not E8M0 codes
        q_scale, k_scale = e8m0_to_float(q_scale), e8m0_to_float(k_scale)
    return _launch(
        q, k, v, out, d_out, lse, (q8, q_scale), (k8, k_scale), seqs, span_kv, qkv_format,
        recipe, attn_mask_type, window_size, softmax_scale, launch_config, unguarded,
    )  # fmt: skip


def check_forward_outputs(q, out, d_out, lse, t_q: int) -> None:
    """ValueError unless out and d_out have q's shape and dtype and lse is fp32 [h, t_q]: what
    every backward takes from the forward."""
    for name, x in (("out", out), ("d_out", d_out)):
        if x.shape != q.shape or x.dtype != q.dtype:
            raise ValueError(f"{name} must have q's shape and dtype, got {x.shape}, {x.dtype}")
    if lse.shape != (q.shape[-2], t_q) or lse.dtype != torch.float32:
        raise ValueError(f"lse must be fp32 [h, t_q] = {[q.shape[-2], t_q]}, got {lse.shape}")


def _max_seqlen(cu: torch.Tensor, given: Optional[int], side: str) -> int:
    if given is not None:
        return int(given)
    if cu.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise ValueError(
            f"thd under CUDA graph capture needs max_seqlen_{side} (the longest real sequence,"
            f" or more): the launcher cannot read cu_seqlens_{side} on the host"
        )
    return int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0


def row_statistics(
    q: torch.Tensor,
    k: torch.Tensor,
    out: torch.Tensor,
    d_out: torch.Tensor,
    lse: torch.Tensor,
    *,
    qkv_format: str = "bshd",
    attn_mask_type: str = "causal",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(D, LSE2), fp32 [h, t_q] each, of a dense (bshd or sbhd) call: D = rowsum(dO * O) over
    the elements where dO != 0 and LSE2 = LSE * log2(e) (+inf where LSE = -inf), as every
    backward of this package reads them (backward_preprocess_kernel); for the CUDA backward."""
    seqs = sequences(q, k, qkv_format, attn_mask_type, None, None, None, None, None)
    return _preprocess(_d_contiguous(out), _d_contiguous(d_out), lse, seqs, qkv_format)


DEQUANTIZE_BLOCK_ROWS = 32


def dequantized_rows(
    x8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """x8 [..., d] e4m3 (contiguous) times its per-row scale_inv [...] fp32, in `dtype` (bf16 or
    fp16) saturated to its finite range (NaN kept): the dequantized operands the backward's dK
    and dQ products take (_dequantize of backward_kernel.py), for the CUDA backward."""
    out = torch.empty(x8.shape, dtype=dtype, device=x8.device)
    rows = scale.numel()
    if rows > 0:
        grid = (triton.cdiv(rows, DEQUANTIZE_BLOCK_ROWS),)
        dequantize_rows_kernel[grid](
            x8, scale.contiguous(), out, rows, HEAD_DIM=x8.shape[-1], BR=DEQUANTIZE_BLOCK_ROWS
        )
    return out


def _preprocess(out, d_out, lse, seqs, qkv_format, guards=True):
    """backward_preprocess_kernel: (D, LSE2) [h, t_q] fp32 (row_statistics says what)."""
    num_heads, head_dim, t_q = out.shape[-2], out.shape[-1], lse.shape[1]
    delta = torch.empty(num_heads, t_q, dtype=torch.float32, device=out.device)
    lse2 = torch.empty_like(delta)
    lse = lse.contiguous()
    sob, sos, soh = _layout_strides(out, qkv_format)
    sdb, sds, sdh = _layout_strides(d_out, qkv_format)
    cu = (seqs.cu_q, seqs.cu_q_start, seqs.cu_kv, seqs.cu_kv_start)
    if seqs.span_q > 0:
        grid = (seqs.num_seqs * num_heads, triton.cdiv(seqs.span_q, PREPROCESS_BLOCK_M))
        backward_preprocess_kernel[grid](
            out, d_out, lse, delta, lse2, *cu, sob, sos, soh, sdb, sds, sdh, lse.stride(0),
            num_heads, seqs.span_q, seqs.span_kv, int(seqs.varlen),
            HEAD_DIM=head_dim, BM=PREPROCESS_BLOCK_M, GUARDS=guards, num_warps=4,
        )  # fmt: skip
    return delta, lse2


def _launch(
    q, k, v, out, d_out, lse, q_fp8, k_fp8, seqs, span_kv, qkv_format, recipe, attn_mask_type,
    window_size, softmax_scale, launch_config, unguarded,
):  # fmt: skip
    num_heads, head_dim = q.shape[-2], q.shape[-1]
    num_kv_heads = k.shape[-2]
    # thd: tokens outside every sequence's grid rows (gaps, a padded allocation past
    # max_seqlen, tokens after the last sequence) are never written by the kernels
    alloc = torch.zeros if seqs.varlen else torch.empty
    dq = alloc(q.shape, dtype=q.dtype, device=q.device)
    dk = alloc(k.shape, dtype=k.dtype, device=k.device)
    dv = alloc(v.shape, dtype=v.dtype, device=v.device)
    if seqs.num_seqs == 0 or dq.numel() == 0 and dk.numel() == 0:
        return dq, dk, dv
    (q8, q_scale), (k8, k_scale) = q_fp8, k_fp8
    v, out, d_out = (_d_contiguous(x) for x in (v, out, d_out))
    sdb, sds, sdh = _layout_strides(d_out, qkv_format)
    svb, svs, svh = _layout_strides(v, qkv_format)
    sqb, sqs, sqh = _layout_strides(dq, qkv_format)
    skb, sks, skh = _layout_strides(dk, qkv_format)
    delta, lse2 = _preprocess(out, d_out, lse, seqs, qkv_format, guards=not unguarded)
    left, right = window_size if window_size is not None else (-1, -1)
    if "causal" in attn_mask_type:
        right = 0
    left, right = (UNBOUNDED if x < 0 else x for x in (left, right))
    bottom_right = int(attn_mask_type not in _TOP_LEFT_MASKS)
    cu = (seqs.cu_q, seqs.cu_q_start, seqs.cu_kv, seqs.cu_kv_start)
    guards = not unguarded
    (bm1, bn1, w1, s1), (bm2, bn2, w2, s2) = launch_config or LAUNCH_CONFIG[(recipe, head_dim)]
    common = (q8, q_scale, k8, k_scale, v, d_out)
    strides = (
        q8.stride(0), q_scale.stride(0), k8.stride(0), k_scale.stride(0),
        svb, svs, svh, sdb, sds, sdh,
    )  # fmt: skip
    scalars = (
        num_heads, num_kv_heads, num_heads // num_kv_heads, seqs.span_q, seqs.span_kv,
        left, right, int(seqs.varlen), bottom_right,
        softmax_scale * 1.4426950408889634, softmax_scale,
    )  # fmt: skip
    meta = dict(HEAD_DIM=head_dim, RECIPE_MX=recipe == "mxfp8", GUARDS=guards)
    if span_kv > 0 and seqs.span_q > 0:
        grid = (seqs.num_seqs * num_kv_heads, triton.cdiv(span_kv, bn1))
        backward_dkdv_kernel[grid](
            *common, dk, dv, delta, lse2, *cu, *strides, skb, sks, skh, delta.stride(0),
            *scalars, BM=bm1, BN=bn1, num_warps=w1, num_stages=s1, **meta,
        )  # fmt: skip
        grid = (seqs.num_seqs * num_heads, triton.cdiv(seqs.span_q, bm2))
        backward_dq_kernel[grid](
            *common, dq, delta, lse2, *cu, *strides, sqb, sqs, sqh, delta.stride(0),
            *scalars, BM=bm2, BN=bn2, num_warps=w2, num_stages=s2, **meta,
        )  # fmt: skip
    else:  # no keys or no queries: nothing to see, every gradient is 0
        for x in (dq, dk, dv):
            x.zero_()
    return dq, dk, dv
