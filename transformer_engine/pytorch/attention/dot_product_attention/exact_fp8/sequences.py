"""Where the sequences of one attention call live: their real lengths and first tokens along the
flattened token axes of q and of k / v (bshd, sbhd and thd; padding masks), as the Triton and
the sm90 CUDA kernels read them. The offsets stay on the device: building them never reads
cu_seqlens back to the host, except thd's max_seqlen_q when the caller does not give it.
"""

import functools
from typing import NamedTuple

import torch

from .vt_layout import dense_needs_alignment, dense_offsets

__all__ = ["Sequences", "sequences", "dense_sequences"]


class Sequences(NamedTuple):
    """Where the sequences live along the flattened token axes of q and of k/v.

    cu_* [num_seqs + 1] int32 on the device: cu_q/cu_kv give the real lengths, cu_*_start the
    first token of each sequence (used by thd only; dense layouts have span_* tokens per sample).
    span_q: tokens per sample (dense), or max_seqlen_q (thd: the grid's rows per sequence; the
    host never reads the offsets). span_kv: tokens per sample (dense), 0 (thd).
    """

    num_seqs: int
    span_q: int
    span_kv: int
    cu_q: torch.Tensor
    cu_q_start: torch.Tensor
    cu_kv: torch.Tensor
    cu_kv_start: torch.Tensor
    varlen: bool
    align_v: bool  # V8^T in vt_layout's aligned layout (thd, or dense samples off the 16-grid)


def sequences(
    q, k, qkv_format, attn_mask_type, cu_q, cu_kv, cu_q_padded, cu_kv_padded, max_seqlen_q
) -> Sequences:
    device = q.device
    if qkv_format == "thd":
        # The offsets stay on the device (no sync; capturable): the grid covers max_seqlen_q rows
        # per sequence (the kernel zeroes a padded allocation's rows past it) and V8^T takes
        # the aligned layout, whose columns and size need no offsets (see quantize's sync_free).
        if cu_q is None or cu_kv is None:
            raise ValueError("thd needs cu_seqlens_q and cu_seqlens_kv")
        cu_q, cu_kv = (_int32(x, device) for x in (cu_q, cu_kv))
        start_q = cu_q if cu_q_padded is None else _int32(cu_q_padded, device)
        start_kv = cu_kv if cu_kv_padded is None else _int32(cu_kv_padded, device)
        if not cu_q.shape == cu_kv.shape == start_q.shape == start_kv.shape:
            raise ValueError("cu_seqlens_q/kv (and their padded versions) must have equal lengths")
        if max_seqlen_q is None:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise ValueError(
                    "thd under CUDA graph capture needs max_seqlen_q (the longest real query"
                    " sequence, or more): the launcher cannot read cu_seqlens_q on the host"
                )
            max_seqlen_q = int((cu_q[1:] - cu_q[:-1]).max()) if cu_q.numel() > 1 else 0
        span_kv = 0  # the kernel reads kv spans from cu_seqlens_kv(_padded)
        return Sequences(
            cu_q.numel() - 1, int(max_seqlen_q), span_kv, cu_q, start_q, cu_kv, start_kv,
            varlen=True, align_v=True,
        )  # fmt: skip
    b_dim, s_dim = (0, 1) if qkv_format == "bshd" else (1, 0)
    batch, s_q, s_kv = q.shape[b_dim], q.shape[s_dim], k.shape[s_dim]
    if k.shape[b_dim] != batch:
        raise ValueError(f"q and k hold different batch sizes: {q.shape}, {k.shape}")
    if "padding" not in attn_mask_type:
        return dense_sequences(batch, s_q, s_kv, device)
    cu_q = _dense_lengths(cu_q, batch, s_q, device)
    cu_kv = _dense_lengths(cu_kv, batch, s_kv, device)
    return Sequences(
        batch, s_q, s_kv, cu_q, cu_q, cu_kv, cu_kv, False, dense_needs_alignment(batch, s_kv)
    )


def dense_sequences(batch: int, s_q: int, s_kv: int, device: torch.device) -> Sequences:
    """Dense samples without a padding mask: every length is the sample's span. Cached per
    (batch, s_q, s_kv, device) like the offsets it holds (vt_layout.dense_offsets), and built
    afresh while a CUDA graph is being captured, as those are."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return _build_dense_sequences(batch, s_q, s_kv, device)
    return _cached_dense_sequences(batch, s_q, s_kv, device)


def _build_dense_sequences(batch, s_q, s_kv, device):
    cu_q, cu_kv = dense_offsets(batch, s_q, device), dense_offsets(batch, s_kv, device)
    return Sequences(
        batch, s_q, s_kv, cu_q, cu_q, cu_kv, cu_kv, False, dense_needs_alignment(batch, s_kv)
    )


_cached_dense_sequences = functools.lru_cache(maxsize=64)(_build_dense_sequences)


def _int32(x, device) -> torch.Tensor:
    return torch.as_tensor(x, device=device).to(torch.int32).contiguous()


def _dense_lengths(cu, batch, seqlen, device) -> torch.Tensor:
    """[batch + 1] int32 cumulative real lengths of bshd/sbhd samples (all seqlen if cu is None)."""
    if cu is None:  # cached per shape: no kernel launch per call
        return dense_offsets(batch, seqlen, device)
    cu = _int32(cu, device)
    if cu.shape != (batch + 1,):
        raise ValueError(
            f"cu_seqlens must have batch + 1 = {batch + 1} entries, got {tuple(cu.shape)}"
        )
    return cu
