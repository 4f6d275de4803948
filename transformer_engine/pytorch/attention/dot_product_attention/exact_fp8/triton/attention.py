"""Mask-exact FP8 attention forward: the launcher of attention_kernel.attention_forward_kernel.

    out, lse = exact_fp8_attention_forward(q, k, v, recipe="current", attn_mask_type="causal")

Q is quantized inside the kernel (per token for current scaling, per 32 channels for MXFP8); K and
V are quantized here, once, into the token-major layouts the kernel reads (K8 [h_kv, t, d], V8^T
[h_kv, d, t_pad] with one scale per (chunk, kv-head) for current scaling, per (32-token chunk,
channel) for MXFP8). See Note [Mask-exact FP8 scaling] in
formats.py for the rules and docs/attention_kernel.md for the design and the measurements.
"""

import os
from typing import Optional, Tuple

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from .attention_kernel import (
    BLOCK_M_CHOICES,
    BLOCK_N,
    BOUNDARY_N,
    Q_TILE,
    attention_forward_kernel,
)
from ..kernels import device_capability
from ..formats import MX_BLOCK, RECIPES, V_CHUNK_CURRENT, check_recipe, e8m0_to_float
from .launch import CompiledLauncher
from .masking import UNBOUNDED
from .. import quantize
from ..masks import QKV_FORMATS, check_mask_type
from ..sequences import sequences
from ..vt_layout import dense_column_starts

__all__ = ["RECIPES", "HEAD_DIMS", "exact_fp8_attention_forward"]

HEAD_DIMS = (64, 128)
_TOP_LEFT_MASKS = ("causal", "padding_causal")

# (block_m, num_warps, num_stages, maxnreg) per (recipe, head dim): launch parameters only.
# block_m (query rows per program, a divisor of Q_TILE) changes no FP8 decision (taken per
# Q_TILE) and no output bit (tests/pytorch/attention/test_exact_fp8_attention.py checks).
# Measured on the H200: benchmarks/results/attention_forward.md; design: docs/attention_kernel.md.
# Rules v2 (the V scale a per-tile scalar) retried 128-row programs and other depths on the H200
# (benchmarks/results/v_scale_rules.md, 2026-12-01): kernel alone at 8k m128w8s3 1.23x and
# m128w8s2 1.31x the time of m64w4s3, m64w4s2 1.12x, m64w4s4 1.65x; so 64 rows, 3 stages stay.
_LAUNCH_CONFIG = {
    ("current", 64): (64, 4, 3, None),
    ("current", 128): (64, 4, 3, None),
    ("mxfp8", 64): (64, 4, 3, None),
    ("mxfp8", 128): (64, 4, 3, None),
}


# Calls of a configuration seen before launch the compiled kernel without Triton's argument
# binder (triton/launch.py): the larger part of the JIT's host time per call.
_KERNEL = CompiledLauncher(attention_forward_kernel)


def exact_fp8_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
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
    fp8_v_everywhere: bool = False,
    q_fp8: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    kv_fp8: Optional[Tuple[tuple, tuple]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Mask-exact FP8 attention forward. Returns (out, lse).

    q [b, s_q, h, d] (bshd), [s_q, b, h, d] (sbhd) or [t_q, h, d] (thd); k, v likewise with h_kv
    heads (h % h_kv == 0), bf16 or fp16, d in HEAD_DIMS. recipe: "current" (Float8CurrentScaling,
    with use_power_2_scales and amax_epsilon) or "mxfp8" (MXFP8BlockScaling).
    attn_mask_type / window_size: as masks.allowed_positions (TE's names; -1 = unbounded side).
    cu_seqlens_q/kv [num_seqs + 1] int32: thd sequence lengths (required), or the real lengths of
    bshd/sbhd samples under the padding mask types; cu_seqlens_*_padded: thd allocation.
    max_seqlen_q: thd only, at least the longest real query sequence (computed from
    cu_seqlens_q when absent, one host sync); the grid covers that many rows per sequence, and
    rows of a longer padded allocation are padding. max_seqlen_kv is accepted for TE's signature
    and not needed.

    out: q's shape and dtype, contiguous; rows past a sequence's real length and rows that see
    no key are 0. lse: [h, t_q] fp32, natural log of the softmax denominator of the scaled scores,
    token-major over the flattened (b, s) query axis (thd: the packed axis); -inf where out is 0.

    q_fp8: an already quantized Q, token-major (data [h, t_q, d] e4m3, scale_inv [h, t_q] fp32
    for "current" or E8M0 codes [h, t_q, d // 32] uint8 for "mxfp8"); q then only gives the
    shape, dtype and layout. Used where the in-kernel cast cannot run (Triton's interpreter).

    kv_fp8: an already quantized K and V, ((K8, k_scales), (V8^T, v_scales, cu_chunks, cu_vt))
    as this launcher's own K/V casts make them (context_parallel.payload.quantize_kv does, for
    the ring of context parallelism: K and V travel quantized); bshd/sbhd only, checked by
    shape, used as given (the caller owns the rules: chunks start at each sample's first key).
    k then only gives the shape, and v is read on boundary tiles only (a ring step without
    boundary tiles may pass a stand-in, context_parallel.steps.unread_v).

    CUDA graphs: calls can be captured (torch.cuda.graph) once a call of the same configuration
    has run outside the capture (Triton compiles there); cu_seqlens must then be on the device,
    and thd needs max_seqlen_q. The host never reads thd offsets, so a replay may take other
    cu_seqlens contents (the same number of sequences, real lengths <= max_seqlen_q).

    fp8_v_everywhere=True is a LEAKY lower bound for benchmarks only: every KV tile uses FP8 V,
    also the boundary tiles whose V chunks hold positions the mask hides, which breaks the
    invariant of Note [Mask-exact FP8 scaling]. Never use it for results.
    """
    _check_inputs(q, k, v, recipe, qkv_format, attn_mask_type, window_size)
    if recipe == "mxfp8" and (use_power_2_scales or amax_epsilon != 0.0):
        raise ValueError("use_power_2_scales and amax_epsilon belong to current scaling only")
    seqs = sequences(
        q, k, qkv_format, attn_mask_type, cu_seqlens_q, cu_seqlens_kv,
        cu_seqlens_q_padded, cu_seqlens_kv_padded, max_seqlen_q,
    )  # fmt: skip
    del max_seqlen_kv  # the kernel reads every kv length from cu_seqlens_kv
    if kv_fp8 is None:
        k_fp8 = _quantize_k(k, qkv_format, recipe, use_power_2_scales, amax_epsilon)
        v_fp8 = _quantize_v(v, qkv_format, seqs, recipe, use_power_2_scales, amax_epsilon)
    else:
        k_fp8, v_fp8 = _check_kv_fp8(kv_fp8, k, seqs, recipe)
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    return _launch(
        q, q_fp8, k_fp8, v_fp8, v, seqs, qkv_format, recipe, attn_mask_type, window_size,
        softmax_scale, use_power_2_scales, amax_epsilon, fp8_v_everywhere,
    )  # fmt: skip


def _check_inputs(q, k, v, recipe, qkv_format, attn_mask_type, window_size):
    check_recipe(recipe)
    if qkv_format not in QKV_FORMATS:
        raise ValueError(f"qkv_format must be one of {QKV_FORMATS}, got {qkv_format!r}")
    check_mask_type(attn_mask_type, window_size)
    ndim = 3 if qkv_format == "thd" else 4
    if any(x.dim() != ndim for x in (q, k, v)):
        raise ValueError(
            f"{qkv_format} needs {ndim}-d q, k, v; got {q.dim()}, {k.dim()}, {v.dim()}"
        )
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(
            f"q, k, v must all be bfloat16 or all float16, got {q.dtype, k.dtype, v.dtype}"
        )
    d = q.shape[-1]
    if d not in HEAD_DIMS or k.shape[-1] != d or v.shape[-1] != d:
        raise ValueError(f"head dims of q, k, v must be equal and in {HEAD_DIMS}, got {d}")
    if k.shape != v.shape or q.shape[-2] % k.shape[-2]:
        raise ValueError(f"k, v must match and h_kv must divide h: {q.shape}, {k.shape}, {v.shape}")
    if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("exact FP8 attention runs on CUDA tensors (or under TRITON_INTERPRET=1)")
    if q.device.type == "cuda" and device_capability(q.device) < (8, 9):
        raise ValueError("exact FP8 attention needs FP8 tensor cores (compute capability >= 8.9)")


def _quantize_k(k, qkv_format, recipe, use_power_2_scales, amax_epsilon):
    """K8 [h_kv, t, d] e4m3 + scale_inv [h_kv, t] fp32 (current) or codes [h_kv, t, d // 32]."""
    k = _d_contiguous(k)
    if recipe == "mxfp8":
        return quantize.per_block_cast_to_mxfp8_rowwise(k, qkv_format=qkv_format)
    return quantize.per_token_cast_to_fp8(
        k, qkv_format=qkv_format, use_power_2_scales=use_power_2_scales, amax_epsilon=amax_epsilon
    )


def _quantize_v(v, qkv_format, seqs, recipe, use_power_2_scales, amax_epsilon):
    """V8^T [h_kv, d, width] e4m3, scales (current: [h_kv, n_chunks] fp32 scale_inv, amax over
    the chunk's tokens and channels; MXFP8: [h_kv, n_chunks, d] E8M0 codes), cu_chunks
    [num_seqs + 1] int32, cu_vt [num_seqs + 1] int32: the V8^T column of each sequence's first
    key.

    Chunks of V_CHUNK_CURRENT (current) or MX_BLOCK (mxfp8) tokens start at each sequence's
    first token (thd: at cu_seqlens_kv_padded). See Note [Mask-exact FP8 scaling]. Sequences
    start at 16-token aligned columns of V8^T: the quantizer writes vt_layout's aligned layout
    (32-column spans) for thd (whose offsets the host does not read: sizes are bounds, see
    quantize's sync_free) and for dense samples whose first token is not on the 16-grid.
    """
    v = _d_contiguous(v)
    chunk = MX_BLOCK if recipe == "mxfp8" else V_CHUNK_CURRENT
    layout = dict(qkv_format=qkv_format, aligned_columns=seqs.align_v)
    if seqs.varlen:  # the aligned layout's offsets (seqs.align_v), for the quantizer and the kernel
        offsets = quantize.sequence_offsets(seqs.cu_kv_start, chunk)
        layout.update(cu_seqlens=seqs.cu_kv_start, sync_free=True, offsets=offsets)
        cu_vt = offsets[1]
    else:
        cu_vt = dense_column_starts(seqs.num_seqs, seqs.span_kv, v.device, seqs.align_v)
    if recipe == "mxfp8":
        v8t, scales, cu_chunks = quantize.per_chunk_cast_to_mxfp8_columnwise_transposed(v, **layout)
    else:
        v8t, scales, cu_chunks = quantize.per_chunk_cast_to_fp8_transposed(
            v, chunk=chunk, use_power_2_scales=use_power_2_scales, amax_epsilon=amax_epsilon,
            **layout,
        )  # fmt: skip
    return v8t, scales, cu_chunks, cu_vt


def _check_kv_fp8(kv_fp8, k, seqs, recipe):
    """kv_fp8 as _quantize_k / _quantize_v return them, checked by shape and dtype."""
    if seqs.varlen or seqs.align_v:
        raise ValueError("kv_fp8 takes dense layouts whose samples start on the 16-column grid")
    (k8, k_scale), (v8t, v_scale, cu_chunks, cu_vt) = kv_fp8
    h_kv, d, t = k.shape[-2], k.shape[-1], seqs.num_seqs * seqs.span_kv
    chunk = MX_BLOCK if recipe == "mxfp8" else V_CHUNK_CURRENT
    n_chunks = seqs.num_seqs * (-(-seqs.span_kv // chunk))
    want = {
        "K8": (k8, (h_kv, t, d)),
        "k scales": (k_scale, (h_kv, t, d // MX_BLOCK) if recipe == "mxfp8" else (h_kv, t)),
        "V8^T": (v8t, (h_kv, d, v8t.shape[-1])),
        "v scales": (v_scale, (h_kv, n_chunks, d) if recipe == "mxfp8" else (h_kv, n_chunks)),
    }
    for name, (x, shape) in want.items():
        if tuple(x.shape) != shape or not x.is_contiguous() or x.device != k.device:
            raise ValueError(f"kv_fp8: {name} must be contiguous {shape} on {k.device}")
    if k8.dtype != torch.float8_e4m3fn or v8t.dtype != k8.dtype or v8t.shape[-1] < t:
        raise ValueError("kv_fp8: K8 and V8^T must be e4m3, V8^T with a column per key")
    if cu_chunks.shape != (seqs.num_seqs + 1,) or cu_vt.shape != cu_chunks.shape:
        raise ValueError(f"kv_fp8: cu_chunks and cu_vt must have {seqs.num_seqs + 1} entries")
    return (k8, k_scale), (v8t, v_scale, cu_chunks, cu_vt)


def _layout_strides(x, qkv_format):
    """(batch, token, head) strides of x in its qkv format (d must be contiguous)."""
    if qkv_format == "bshd":
        return x.stride(0), x.stride(1), x.stride(2)
    if qkv_format == "sbhd":
        return x.stride(1), x.stride(0), x.stride(2)
    return 0, x.stride(0), x.stride(1)


def _d_contiguous(x):
    return x if x.stride(-1) == 1 else x.contiguous()


def _query_operand(q, q_fp8, qkv_format, seqs, recipe):
    """(Q pointer tensor, its (batch, token, head) strides, Q_SCALE tensor or None)."""
    if q_fp8 is None:
        q = _d_contiguous(q)
        return q, _layout_strides(q, qkv_format), None
    data, scale = (x.contiguous() for x in q_fp8)
    h, t, d = data.shape
    if data.dtype != torch.float8_e4m3fn or (h, d) != (q.shape[-2], q.shape[-1]):
        raise ValueError(f"q_fp8 data must be e4m3 [h, t, d] matching q, got {data.shape}")
    want = (h, t) if recipe == "current" else (h, t, d // MX_BLOCK)
    if tuple(scale.shape) != want:
        raise ValueError(f"q_fp8 scales must have shape {want} for {recipe}, got {scale.shape}")
    stride_b = 0 if seqs.varlen else seqs.span_q * d
    return data, (stride_b, d, t * d), scale


def _tma_descriptors(k8: torch.Tensor, v8t: torch.Tensor, boundary_n: Optional[int]):
    """Host TMA descriptors of K8 [h_kv, t, d] as [h_kv * t, d] (block [BLOCK_N, d]) and of
    V8^T [h_kv, d, t_pad] as [h_kv * d, t_pad] (blocks [d, BLOCK_N] and [d, boundary_n]).
    boundary_n None: only the leaky mode reads V8^T on boundary sub-tiles, so the second V8^T
    descriptor is the first (an argument the kernel does not read; one less to build per call).

    Both are contiguous with 16-byte rows (d and t_pad are multiples of 16), as TMA requires.
    Without keys, the descriptors cover a zero tile that no program reads.
    """
    d = k8.shape[-1]
    if k8.numel() == 0:
        k8 = torch.zeros(BLOCK_N, d, dtype=k8.dtype, device=k8.device)
        v8t = torch.zeros(d, BLOCK_N, dtype=v8t.dtype, device=v8t.device)
    k_desc = TensorDescriptor.from_tensor(k8.reshape(-1, d), [BLOCK_N, d])
    v8t = v8t.reshape(-1, v8t.shape[-1])
    vt_desc = TensorDescriptor.from_tensor(v8t, [d, BLOCK_N])
    if boundary_n is None:
        return k_desc, vt_desc, vt_desc
    return k_desc, vt_desc, TensorDescriptor.from_tensor(v8t, [d, boundary_n])


def _launch(
    q, q_fp8, k_fp8, v_fp8, v, seqs, qkv_format, recipe, attn_mask_type, window_size,
    softmax_scale, use_power_2_scales, amax_epsilon, fp8_v_everywhere, launch_config=None,
    boundary_n=BOUNDARY_N,
):  # fmt: skip
    """Run the kernel; launch_config (as the values of _LAUNCH_CONFIG) overrides the table.

    boundary_n: the boundary sub-tile width, for ablations only: unlike launch_config it changes
    the order of the online softmax's steps, so the output bits (never what the mask hides).
    """
    num_heads, head_dim = q.shape[-2], q.shape[-1]
    t_q = q.shape[0] if qkv_format == "thd" else q.shape[0] * q.shape[1]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(num_heads, t_q, dtype=torch.float32, device=q.device)
    if t_q == 0 or seqs.num_seqs == 0 or seqs.span_q == 0:
        return out, lse.fill_(float("-inf"))
    q_op, (sqb, sqs, sqh), q_scale = _query_operand(q, q_fp8, qkv_format, seqs, recipe)
    k8, k_scale = k_fp8
    v8t, v_scale, cu_chunks, cu_vt = v_fp8
    if recipe == "mxfp8":  # the kernel reads fp32 powers of two (exact), not E8M0 codes
        k_scale, v_scale = e8m0_to_float(k_scale), e8m0_to_float(v_scale)
    if BLOCK_N % boundary_n or boundary_n % MX_BLOCK:
        raise ValueError(f"boundary_n must divide {BLOCK_N} in multiples of {MX_BLOCK}")
    k_desc, vt_desc, vt_desc_b = _tma_descriptors(k8, v8t, boundary_n if fp8_v_everywhere else None)
    v = _d_contiguous(v)
    svb, svs, svh = _layout_strides(v, qkv_format)
    sob, sos, soh = _layout_strides(out, qkv_format)
    left, right = window_size if window_size is not None else (-1, -1)
    if "causal" in attn_mask_type:
        right = 0
    block_m, num_warps, num_stages, maxnreg = launch_config or _LAUNCH_CONFIG[(recipe, head_dim)]
    if block_m not in BLOCK_M_CHOICES:
        raise ValueError(f"block_m must be one of {BLOCK_M_CHOICES}, got {block_m}")
    grid = (seqs.num_seqs * num_heads, -(-seqs.span_q // block_m))
    _KERNEL(
        grid,
        (
            q_op, q_scale if q_scale is not None else k_scale, k8, k_scale, v8t, v_scale, v, out,
            lse, k_desc, vt_desc, vt_desc_b,
            seqs.cu_q, seqs.cu_q_start, seqs.cu_kv, seqs.cu_kv_start, cu_chunks, cu_vt,
            sqb, sqs, sqh, q_scale.stride(0) if q_scale is not None else 0,
            k8.stride(0), k_scale.stride(0), v8t.stride(0), v8t.stride(1), v_scale.stride(0),
            svb, svs, svh, sob, sos, soh, lse.stride(0),
            num_heads, num_heads // k8.shape[0], seqs.span_q, seqs.span_kv,
            UNBOUNDED if left < 0 else left, UNBOUNDED if right < 0 else right,
            int(seqs.varlen), int(attn_mask_type not in _TOP_LEFT_MASKS), int(use_power_2_scales),
            float(softmax_scale) * 1.4426950408889634, float(amax_epsilon),
        ),
        dict(
            HEAD_DIM=head_dim, RECIPE_MX=recipe == "mxfp8", QUANTIZE_Q=q_fp8 is None,
            FP8_V_EVERYWHERE=bool(fp8_v_everywhere),
            BM=block_m, BN=BLOCK_N, BNB=boundary_n, QT=Q_TILE,
        ),
        dict(num_warps=num_warps, num_stages=num_stages, maxnreg=maxnreg),
    )  # fmt: skip
    return out, lse
