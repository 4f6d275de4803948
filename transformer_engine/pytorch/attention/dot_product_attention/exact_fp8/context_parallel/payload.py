"""K and V as they travel the ring of context parallelism: FP8 data plus their scales.

A rank quantizes its own K and V once (`quantize_kv`), by the fork's rules (Note [Mask-exact
FP8 scaling] in formats.py): K per (token, kv-head), V per (chunk of V_CHUNK_CURRENT tokens,
kv-head) for current scaling (MXFP8: K per 32 channels, V per 32 tokens and channel). Every scale
reduces over the rank's own tokens only, and, with chunking.check_seqlen's lengths, over one
load-balanced chunk only: no scale straddles two shards, and no amax is reduced over the group
(upstream's FP8 ring reduces one amax over all ranks, which is what leaks).

What travels (`wire`): K8 [h_kv, t, d] e4m3, K scales, V8^T [h_kv, d, t] e4m3, V scales: for
current scaling (t * h_kv) * (2 d + 4) + 4 * h_kv * t / 128 bytes against 4 d * t * h_kv for BF16
K and V: 0.52x at d = 128. The unquantized V stays on its rank: only the diagonal step (the
rank's own K and V) has boundary tiles (chunking's module doc). The layouts are the Triton
launcher's own (its kv_fp8 argument): bshd / sbhd, token i of the flattened (b, s) axis in
column i of V8^T.
"""

from dataclasses import dataclass, replace
from typing import List, Optional, Tuple

import torch

from .. import quantize
from ..formats import MX_BLOCK, V_CHUNK_CURRENT, check_recipe, e8m0_to_float
from ..masks import SeqLayout
from ..vt_layout import ALIGN_COLUMNS, dense_column_starts

__all__ = ["KVPayload", "quantize_kv"]


@dataclass(frozen=True)
class KVPayload:
    """One rank's K and V, quantized. shape: K's (= V's) shape in qkv_format; v: the
    unquantized V, on its own rank only (None once received)."""

    rank: int
    recipe: str
    qkv_format: str
    shape: Tuple[int, ...]
    dtype: torch.dtype
    k_fp8: Tuple[torch.Tensor, torch.Tensor]
    v_fp8: Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    v: Optional[torch.Tensor] = None

    @property
    def kv_fp8(self):
        """The Triton launcher's kv_fp8 argument."""
        return self.k_fp8, self.v_fp8

    def wire(self) -> List[torch.Tensor]:
        """The tensors that travel: K8, K scales, V8^T, V scales (cu_chunks and cu_vt follow
        from the shape, which every rank of the ring shares)."""
        return [self.k_fp8[0], self.k_fp8[1], self.v_fp8[0], self.v_fp8[1]]

    def nbytes(self) -> int:
        return sum(x.numel() * x.element_size() for x in self.wire())

    def received(self, tensors: List[torch.Tensor], rank: Optional[int] = None) -> "KVPayload":
        """The payload a neighbour rebuilds from `tensors` (a wire() of rank `rank`, default
        this payload's; this payload serves as the template of shapes and offsets)."""
        k8, ks, v8t, vs = tensors
        rank = self.rank if rank is None else rank
        return replace(self, rank=rank, k_fp8=(k8, ks), v_fp8=(v8t, vs) + self.v_fp8[2:], v=None)

    def dequantize(self, dtype=torch.float64) -> Tuple[torch.Tensor, torch.Tensor]:
        """(K, V8) dequantized, token-major [t, h_kv, d] over the flattened (b, s) axis, on the
        CPU: exactly (in fp64) the values the kernel multiplies (K always, V on FP8 tiles). The
        oracle of a ring step reads them (reference/context_parallel.py); a ring backward would
        rebuild K from them (Note [BF16 backward of the FP8 forward] in te/autograd.py)."""
        k8, ks = (x.cpu() for x in self.k_fp8)
        v8t, vs, _, _ = (x.cpu() for x in self.v_fp8)
        h_kv, t, d = k8.shape
        if self.recipe == "mxfp8":
            k_scale = e8m0_to_float(ks).to(dtype).repeat_interleave(MX_BLOCK, dim=-1)
        else:
            k_scale = ks.to(dtype).unsqueeze(-1)
        k = (k8.to(dtype) * k_scale).transpose(0, 1)
        batch, seqlen = _batch_seqlen(self.shape, self.qkv_format)
        chunk = MX_BLOCK if self.recipe == "mxfp8" else V_CHUNK_CURRENT
        ids, _ = SeqLayout.dense(batch, seqlen).chunk_ids(chunk)
        v_scale = (e8m0_to_float(vs) if self.recipe == "mxfp8" else vs).to(dtype)[:, ids]
        if self.recipe != "mxfp8":
            v_scale = v_scale.unsqueeze(-1)  # [h_kv, t, 1]
        v8 = v8t[:, :, :t].transpose(1, 2).to(dtype)  # [h_kv, t, d]
        return k, (v8 * v_scale).transpose(0, 1)


def _batch_seqlen(shape, qkv_format) -> Tuple[int, int]:
    if qkv_format == "bshd":
        return shape[0], shape[1]
    if qkv_format == "sbhd":
        return shape[1], shape[0]
    raise ValueError(f"context parallelism takes bshd or sbhd here, got {qkv_format!r}")


def quantize_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    rank: int,
    recipe: str,
    qkv_format: str = "bshd",
    use_power_2_scales: bool = False,
    amax_epsilon: float = 0.0,
    backend: str = "auto",
) -> KVPayload:
    """A rank's K and V [b, s, h_kv, d] (bshd) or [s, b, h_kv, d] (sbhd) as the launcher's own
    casts quantize them (bit for bit: the same quantize.py calls), keeping v for the diagonal
    step. s must be a multiple of 16 (V8^T's plain layout; chunking.check_seqlen gives more)."""
    check_recipe(recipe)
    if recipe == "mxfp8" and (use_power_2_scales or amax_epsilon != 0.0):
        raise ValueError("use_power_2_scales and amax_epsilon belong to current scaling only")
    if k.shape != v.shape or k.dtype != v.dtype:
        raise ValueError(f"k and v must match, got {k.shape, k.dtype} and {v.shape, v.dtype}")
    batch, seqlen = _batch_seqlen(k.shape, qkv_format)
    if seqlen % ALIGN_COLUMNS:
        raise ValueError(f"the local sequence length must be a multiple of {ALIGN_COLUMNS}")
    k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (k, v))
    cast = dict(qkv_format=qkv_format, backend=backend)
    current = dict(use_power_2_scales=use_power_2_scales, amax_epsilon=amax_epsilon)
    if recipe == "mxfp8":
        k_fp8 = quantize.per_block_cast_to_mxfp8_rowwise(k, **cast)
        v8t, vs, cu_chunks = quantize.per_chunk_cast_to_mxfp8_columnwise_transposed(v, **cast)
    else:
        k_fp8 = quantize.per_token_cast_to_fp8(k, **cast, **current)
        v8t, vs, cu_chunks = quantize.per_chunk_cast_to_fp8_transposed(
            v, chunk=V_CHUNK_CURRENT, **cast, **current
        )
    cu_vt = dense_column_starts(batch, seqlen, v.device, False)
    return KVPayload(
        rank, recipe, qkv_format, tuple(k.shape), k.dtype, k_fp8, (v8t, vs, cu_chunks, cu_vt), v
    )
