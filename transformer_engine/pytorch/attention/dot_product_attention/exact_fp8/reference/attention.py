"""Reference attention over quantized (or unquantized) Q, K, V, pure PyTorch (fp64 or fp32 math).

`reference_attention` runs one of the paths below on Q, K, V in any of TE's qkv formats and returns
the output in the input dtype, the log-sum-exp, and which (query tile, KV tile) pairs used FP8 V:

  bf16              no quantization (the control)
  upstream-current  upstream 2.20.2: one current scale over concat(Q, K, V), FP8 V everywhere
  upstream-mxfp8    upstream 2.20.2: MXFP8 Q/K rowwise, V columnwise, FP8 V everywhere
  fork-current      per-token Q/K, one V scale per (chunk, kv-head), FP8 V only on fully
                    visible tiles (rules v2)
  fork-mxfp8        MXFP8 Q/K rowwise, V columnwise, FP8 V only on fully visible tiles

and, for the accuracy benchmark only (BENCHMARK_PATHS, not an audit path, no kernel):

  fork-current-v1   fork-current with the first rule's V scale per (chunk, kv-head, channel)

The fork paths follow Note [Mask-exact FP8 scaling] (formats.py); on their FP8 tiles P is cast
to E4M3 with the fixed scale P_SCALE. The attention math itself is exact-ish (fp64 by default);
this module models the numerics of the rules, not the kernel's accumulation order.
"""

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch

from ..formats import (
    KV_TILE,
    MX_BLOCK,
    P_SCALE,
    Q_TILE,
    V_CHUNK_CURRENT,
    cast_to_e4m3,
    e8m0_to_float,
)
from ..masks import (
    SeqLayout,
    check_mask_type,
    fp8_tile_map,
    from_tokens,
    sequence_masks,
    to_tokens,
)
from .quantize import (
    dequantize,
    dequantize_mxfp8_rowwise,
    expand_chunk_scales,
    per_block_cast_to_mxfp8_rowwise,
    per_chunk_cast_to_mxfp8_columnwise,
    per_chunk_cast_to_fp8,
    per_chunk_channel_cast_to_fp8,
    per_token_cast_to_fp8,
    upstream_current_cast_to_fp8,
)

__all__ = [
    "PATHS", "BENCHMARK_PATHS", "QuantConfig", "ReferenceResult", "dequantized_operands",
    "reference_attention",
]  # fmt: skip

PATHS = ("bf16", "upstream-current", "upstream-mxfp8", "fork-current", "fork-mxfp8")
BENCHMARK_PATHS = PATHS + ("fork-current-v1",)
"""PATHS and the v1 current-scaling rule, which only the accuracy benchmark compares against."""


@dataclass(frozen=True)
class QuantConfig:
    """Recipe knobs that change the current-scaling rules (TE's Float8CurrentScaling fields)."""

    use_power_2_scales: bool = False
    amax_epsilon: float = 0.0


@dataclass
class ReferenceResult:
    out: torch.Tensor  # same shape and dtype as q
    lse: torch.Tensor  # [h, t_q] fp64 natural-log sum-exp of the scaled scores (-inf: empty row)
    fp8_tiles: List[torch.Tensor] = field(default_factory=list)  # per sequence, fp8_tile_map


def _layouts(q, k, qkv_format, seqlens_q, seqlens_kv, cu_seqlens_q, cu_seqlens_kv):
    if qkv_format == "thd":
        if cu_seqlens_q is None or cu_seqlens_kv is None:
            raise ValueError("thd needs cu_seqlens_q and cu_seqlens_kv")
        return SeqLayout.varlen(cu_seqlens_q), SeqLayout.varlen(cu_seqlens_kv)
    b_dim, s_dim = (0, 1) if qkv_format == "bshd" else (1, 0)
    return (
        SeqLayout.dense(q.shape[b_dim], q.shape[s_dim], seqlens_q),
        SeqLayout.dense(k.shape[b_dim], k.shape[s_dim], seqlens_kv),
    )


def dequantized_operands(
    path: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout_kv: SeqLayout,
    cfg: QuantConfig = QuantConfig(),
    dtype: torch.dtype = torch.float64,
):
    """(q, k, v_fp8) of `path` after its quantization rules, dequantized to `dtype`: q, k, v
    token-major [t, h, d] (CPU); v_fp8 is None for bf16. V gets FP8 everywhere here (the fork
    paths replace it on boundary tiles in reference_attention)."""
    if path == "bf16":
        return q.to(dtype), k.to(dtype), None
    if path == "upstream-current":
        qd, kd, vd, s_inv = upstream_current_cast_to_fp8(
            q, k, v, use_power_2_scales=cfg.use_power_2_scales, amax_epsilon=cfg.amax_epsilon
        )
        return tuple(dequantize(x, s_inv, dtype) for x in (qd, kd, vd))
    if path in ("upstream-mxfp8", "fork-mxfp8"):
        qd, qs = per_block_cast_to_mxfp8_rowwise(q)
        kd, ks = per_block_cast_to_mxfp8_rowwise(k)
        vd, vs, _ = per_chunk_cast_to_mxfp8_columnwise(v, layout_kv)
        v_scale = expand_chunk_scales(e8m0_to_float(vs), layout_kv, MX_BLOCK)
        return (
            dequantize_mxfp8_rowwise(qd, qs, dtype),
            dequantize_mxfp8_rowwise(kd, ks, dtype),
            dequantize(vd, v_scale, dtype),
        )
    if path in ("fork-current", "fork-current-v1"):
        kw = dict(use_power_2_scales=cfg.use_power_2_scales, amax_epsilon=cfg.amax_epsilon)
        qd, qs = per_token_cast_to_fp8(q, **kw)
        kd, ks = per_token_cast_to_fp8(k, **kw)
        if path == "fork-current":
            vd, vs, _ = per_chunk_cast_to_fp8(v, layout_kv, **kw)  # vs [num_chunks, h_kv]
            v_scale = expand_chunk_scales(vs, layout_kv, V_CHUNK_CURRENT).unsqueeze(-1)
        else:
            vd, vs, _ = per_chunk_channel_cast_to_fp8(v, layout_kv, **kw)  # [num_chunks, h_kv, d]
            v_scale = expand_chunk_scales(vs, layout_kv, V_CHUNK_CURRENT)
        return (
            dequantize(qd, qs.unsqueeze(-1), dtype),
            dequantize(kd, ks.unsqueeze(-1), dtype),
            dequantize(vd, v_scale, dtype),
        )
    raise ValueError(f"path must be one of {BENCHMARK_PATHS}, got {path!r}")


def _attend_sequence(q, k, v_fp8, v_hi, allowed, tiles, softmax_scale, quantize_p):
    """One sequence. q [sq, h, d], k/v [skv, h_kv, d]; allowed [sq, skv]; tiles: FP8 map or None
    (None: FP8 V everywhere if v_fp8 is given). Returns out [sq, h, d], lse [h, sq]."""
    h, h_kv = q.shape[1], k.shape[1]
    if h % h_kv:
        raise ValueError(f"num heads {h} is not a multiple of num kv heads {h_kv}")
    rep = h // h_kv
    qh = q.transpose(0, 1)  # [h, sq, d]
    kh = k.transpose(0, 1).repeat_interleave(rep, 0)  # [h, skv, d]
    scores = torch.matmul(qh, kh.transpose(1, 2)) * softmax_scale
    scores = scores.masked_fill(~allowed, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)
    empty = torch.isinf(row_max)  # a row that sees nothing
    p = torch.exp(scores - torch.where(empty, torch.zeros_like(row_max), row_max))
    denom = p.sum(dim=-1, keepdim=True)
    lse = (torch.log(denom) + row_max).squeeze(-1)
    v_hi_h = v_hi.transpose(0, 1).repeat_interleave(rep, 0).to(p.dtype)
    if v_fp8 is None:
        num = torch.matmul(p, v_hi_h)
    else:
        if tiles is None:
            use_fp8 = torch.ones_like(allowed)
        else:
            use_fp8 = tiles.repeat_interleave(Q_TILE, 0).repeat_interleave(KV_TILE, 1)
            use_fp8 = use_fp8[: allowed.shape[0], : allowed.shape[1]]
        p_fp8 = p
        if quantize_p:
            p_fp8 = cast_to_e4m3((p * P_SCALE).float()).to(p.dtype) / P_SCALE
        v_fp8_h = v_fp8.transpose(0, 1).repeat_interleave(rep, 0)
        zero = torch.zeros_like(p)
        num = torch.matmul(torch.where(use_fp8, p_fp8, zero), v_fp8_h)
        num = num + torch.matmul(torch.where(use_fp8, zero, p), v_hi_h)
    out = torch.where(empty, torch.zeros_like(num), num / denom)
    return out.transpose(0, 1), lse


def reference_attention(
    path: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    qkv_format: str = "bshd",
    attn_mask_type: str = "causal",
    window_size: Optional[Tuple[int, int]] = None,
    seqlens_q=None,
    seqlens_kv=None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_kv: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    quant: QuantConfig = QuantConfig(),
    compute_dtype: torch.dtype = torch.float64,
    operands: Optional[Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]] = None,
) -> ReferenceResult:
    """Attention of `path` (see module doc). Shapes as TE's DotProductAttention for `qkv_format`;
    seqlens_* give the real lengths of bshd/sbhd samples under padding masks. Output rows past a
    sequence's real length are zero.

    operands: (q, k, v_fp8) already quantized and dequantized (token-major, compute_dtype, as
    dequantized_operands returns them), used instead of quantizing q, k, v here: for K and V that
    were quantized elsewhere (a context-parallel ring's payload, or a leaky control's rule).
    q, k and v still give the shapes and layouts, and v the unquantized V of boundary tiles."""
    check_mask_type(attn_mask_type, window_size)
    if path not in BENCHMARK_PATHS:
        raise ValueError(f"path must be one of {BENCHMARK_PATHS}, got {path!r}")
    layout_q, layout_kv = _layouts(
        q, k, qkv_format, seqlens_q, seqlens_kv, cu_seqlens_q, cu_seqlens_kv
    )
    qt, kt, vt = (to_tokens(x, qkv_format) for x in (q, k, v))
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    if operands is None:
        operands = dequantized_operands(path, qt, kt, vt, layout_kv, quant, compute_dtype)
    q_deq, k_deq, v_fp8 = operands
    exact = path.startswith("fork-")
    out = torch.zeros(qt.shape[:-1] + (v.shape[-1],), dtype=compute_dtype)
    lse = torch.full((q.shape[-2], qt.shape[0]), float("-inf"), dtype=compute_dtype)
    result = ReferenceResult(out=out, lse=lse)
    for n, rows, cols, allowed in sequence_masks(layout_q, layout_kv, attn_mask_type, window_size):
        tiles = fp8_tile_map(allowed, layout_q.lens[n]) if exact else None
        result.fp8_tiles.append(tiles)
        o, l = _attend_sequence(
            q_deq[rows],
            k_deq[cols],
            None if v_fp8 is None else v_fp8[cols],
            vt[cols].to(compute_dtype),
            allowed,
            tiles,
            softmax_scale,
            quantize_p=exact,
        )
        out[rows] = o
        lse[:, rows] = l
    result.out = from_tokens(out.to(q.dtype), qkv_format, q)
    return result
