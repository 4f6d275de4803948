"""Reference quantization rules, pure PyTorch: the fork's mask-exact rules and upstream's leaky ones.

These functions are the oracle of the CUDA quantization kernels (bitwise) and the attention kernel.
Tensors are token-major: x[..., d] for per-token rules, v[t, h, d] (the flattened token axis of
bshd/sbhd/thd, see masks.SeqLayout) for the rules that reduce over tokens. Every function that
chooses a scale follows Note [Mask-exact FP8 scaling] in formats.py (the upstream_* ones are the
counter-examples that break it). Upstream's MXFP8 quantization is the fork's own
(per_block_cast_to_mxfp8_rowwise for Q/K, per_chunk_cast_to_mxfp8_columnwise for V): upstream
leaks only because its attention uses the FP8 V of blocks that straddle the mask boundary.
"""

from typing import List, Tuple

import torch

from ..formats import (
    MX_BLOCK,
    V_CHUNK_CURRENT,
    cast_to_e4m3,
    compute_scale_from_amax,
    e8m0_reciprocal,
    e8m0_to_float,
    float_to_e8m0,
)
from ..masks import SeqLayout

__all__ = [
    "abs_ignoring_nan",
    "per_token_cast_to_fp8",
    "per_chunk_cast_to_fp8",
    "per_chunk_channel_cast_to_fp8",
    "per_block_cast_to_mxfp8_rowwise",
    "per_chunk_cast_to_mxfp8_columnwise",
    "upstream_current_cast_to_fp8",
    "dequantize",
    "expand_chunk_scales",
    "dequantize_mxfp8_rowwise",
]


def _check_float_input(x: torch.Tensor, name: str) -> None:
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"{name} must be bfloat16, float16 or float32, got {x.dtype}")


def per_token_cast_to_fp8(
    x: torch.Tensor, *, use_power_2_scales: bool = False, amax_epsilon: float = 0.0
) -> Tuple[torch.Tensor, torch.Tensor]:
    """E4M3 with one scale per token and head (amax over the last dim, d).

    x: [..., d] -> data [..., d] float8_e4m3fn, scale_inv [...] fp32 (x ~ data * scale_inv).
    See Note [Mask-exact FP8 scaling].
    """
    _check_float_input(x, "x")
    xf = x.float()
    scale = compute_scale_from_amax(
        abs_ignoring_nan(xf).amax(dim=-1),
        use_power_2_scales=use_power_2_scales,
        amax_epsilon=amax_epsilon,
    )
    data = cast_to_e4m3(xf * scale.unsqueeze(-1))
    return data, 1.0 / scale


def abs_ignoring_nan(x: torch.Tensor) -> torch.Tensor:
    """|x| in fp32 with NaN read as 0: amax reductions follow CUDA's fmaxf, which drops NaN.

    A NaN element stays NaN in the FP8 data; it just does not decide its neighbours' scale.
    """
    a = x.float().abs()
    return torch.where(torch.isnan(a), torch.zeros_like(a), a)


def _chunk_amax(v: torch.Tensor, chunk_ids: torch.Tensor, num_chunks: int) -> torch.Tensor:
    """amax over the tokens of each chunk: v [t, h, d] -> [num_chunks, h, d] fp32."""
    _, h, d = v.shape
    keep = chunk_ids >= 0
    index = chunk_ids[keep].view(-1, 1, 1).expand(-1, h, d)
    out = torch.zeros(num_chunks, h, d, dtype=torch.float32)
    return out.scatter_reduce(0, index, abs_ignoring_nan(v)[keep], reduce="amax")


def per_chunk_cast_to_fp8(
    v: torch.Tensor,
    layout: SeqLayout,
    *,
    chunk: int = V_CHUNK_CURRENT,
    use_power_2_scales: bool = False,
    amax_epsilon: float = 0.0,
) -> Tuple[torch.Tensor, torch.Tensor, List[int]]:
    """E4M3 with ONE scale per (kv-head, chunk of `chunk` tokens of one sequence): the fork's
    current-scaling V rule (rules v2).

    v: [t, h_kv, d] -> data [t, h_kv, d] float8_e4m3fn,
    scale_inv [num_chunks, h_kv] fp32 (amax over the chunk's tokens and all d channels of the
    kv-head), cu_chunks [num_seqs + 1]. See Note [Mask-exact FP8 scaling].
    """
    _check_float_input(v, "v")
    ids, cu_chunks = layout.chunk_ids(chunk)
    amax = _chunk_amax(v, ids, cu_chunks[-1]).amax(dim=-1)  # [num_chunks, h_kv]
    scale = compute_scale_from_amax(
        amax, use_power_2_scales=use_power_2_scales, amax_epsilon=amax_epsilon
    )
    per_token = expand_chunk_scales(scale, layout, chunk).unsqueeze(-1)  # [t, h_kv, 1]
    data = cast_to_e4m3(v.float() * per_token)
    return data, 1.0 / scale, cu_chunks


def per_chunk_channel_cast_to_fp8(
    v: torch.Tensor,
    layout: SeqLayout,
    *,
    chunk: int = V_CHUNK_CURRENT,
    use_power_2_scales: bool = False,
    amax_epsilon: float = 0.0,
) -> Tuple[torch.Tensor, torch.Tensor, List[int]]:
    """E4M3 with one scale per (kv-head, chunk of `chunk` tokens of one sequence, channel).

    The fork's first current-scaling V rule (rules v1), kept for the accuracy benchmark only
    (reference_attention's path "fork-current-v1"); no kernel implements it.
    v: [t, h_kv, d] -> data [t, h_kv, d] float8_e4m3fn,
    scale_inv [num_chunks, h_kv, d] fp32 (amax over the chunk's tokens), cu_chunks [num_seqs + 1].
    Mask-exact like the v2 rule (the same chunks): see Note [Mask-exact FP8 scaling].
    """
    _check_float_input(v, "v")
    ids, cu_chunks = layout.chunk_ids(chunk)
    amax = _chunk_amax(v, ids, cu_chunks[-1])
    scale = compute_scale_from_amax(
        amax, use_power_2_scales=use_power_2_scales, amax_epsilon=amax_epsilon
    )
    data = cast_to_e4m3(v.float() * expand_chunk_scales(scale, layout, chunk))
    return data, 1.0 / scale, cu_chunks


def per_block_cast_to_mxfp8_rowwise(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 along the last dim (TE's rowwise usage): x [..., d] -> data [..., d],
    scale codes [..., d // 32] uint8 (E8M0, amax over 32 consecutive channels)."""
    _check_float_input(x, "x")
    d = x.shape[-1]
    if d % MX_BLOCK:
        raise ValueError(f"MXFP8 needs the head dim to be a multiple of {MX_BLOCK}, got {d}")
    blocks = x.float().unflatten(-1, (d // MX_BLOCK, MX_BLOCK))  # [..., d // 32, 32]
    codes = float_to_e8m0(abs_ignoring_nan(blocks).amax(dim=-1))
    data = cast_to_e4m3(blocks * e8m0_reciprocal(codes).unsqueeze(-1))
    return data.flatten(-2), codes


def per_chunk_cast_to_mxfp8_columnwise(
    v: torch.Tensor, layout: SeqLayout
) -> Tuple[torch.Tensor, torch.Tensor, List[int]]:
    """MXFP8 along the tokens (TE's columnwise usage): v [t, h_kv, d] -> data [t, h_kv, d],
    scale codes [num_chunks, h_kv, d] uint8 (E8M0 per 32 tokens of one sequence and channel),
    cu_chunks [num_seqs + 1]."""
    _check_float_input(v, "v")
    ids, cu_chunks = layout.chunk_ids(MX_BLOCK)
    codes = float_to_e8m0(_chunk_amax(v, ids, cu_chunks[-1]))
    data = cast_to_e4m3(v.float() * expand_chunk_scales(e8m0_reciprocal(codes), layout, MX_BLOCK))
    return data, codes, cu_chunks


def expand_chunk_scales(scales: torch.Tensor, layout: SeqLayout, chunk: int) -> torch.Tensor:
    """Per-chunk scales [num_chunks, ...] -> per-token [t, ...] (tokens outside spans: chunk 0)."""
    ids, _ = layout.chunk_ids(chunk)
    return scales[ids.clamp(min=0)]


def dequantize(data: torch.Tensor, scale_inv: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """data * scale_inv in `dtype` (exact in fp64; scale_inv broadcast against data)."""
    return data.to(dtype) * scale_inv.to(dtype)


def dequantize_mxfp8_rowwise(data: torch.Tensor, codes: torch.Tensor, dtype=torch.float64):
    """Inverse of per_block_cast_to_mxfp8_rowwise (exact in fp64)."""
    scales = e8m0_to_float(codes).to(dtype).repeat_interleave(MX_BLOCK, dim=-1)
    return data.to(dtype) * scales


def upstream_current_cast_to_fp8(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    use_power_2_scales: bool = False,
    amax_epsilon: float = 0.0,
):
    """Upstream TE 2.20.2's rule (combine_and_quantize): ONE current amax over concat(Q, K, V).

    Leaky by construction (a masked token sets everybody's scale); kept as the negative control.
    Returns (q_fp8, k_fp8, v_fp8, scale_inv) with a scalar fp32 scale_inv.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_float_input(x, name)
    amax = torch.stack([abs_ignoring_nan(x).amax() for x in (q, k, v)]).amax()
    scale = compute_scale_from_amax(
        amax, use_power_2_scales=use_power_2_scales, amax_epsilon=amax_epsilon
    )
    data = [cast_to_e4m3(x.float() * scale) for x in (q, k, v)]
    return data[0], data[1], data[2], 1.0 / scale
