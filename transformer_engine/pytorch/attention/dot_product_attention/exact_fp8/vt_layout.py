"""Where each sequence's keys sit in V8^T, the FP8 V operand of the attention kernel.

The kernel reads FP8 V^T tiles through TMA boxes, which start on 16-byte (16-column) boundaries,
so every sequence must start on a multiple of ALIGN_COLUMNS. With token i in column i (the V
quantizer's plain layout) that holds when every sequence's first token does. When one does not
(dense samples whose length is not a multiple of 16), or may not (a thd pack: the launcher does
not read its offsets back), the quantizer writes the aligned layout instead
(`aligned_columns=True`): sequence n's tokens from column aligned_column_starts(starts)[n] on,
each span rounded up to a multiple of SPAN_COLUMNS, the columns between them 0 (for a thd pack
whose starts are on the SPAN_COLUMNS grid, the plain layout's columns). Values and scales are the
same: this decides nothing about the quantization.

SPAN_COLUMNS is 32, a DRAM sector, rather than the 16 that TMA needs: every chunk of 32 tokens or
more then starts and ends on a sector, so the V casts write whole sectors. With 16-column spans
the half sectors at the ends of every chunk cost a quarter of the casts' bandwidth on the H200
(benchmarks/results/quantize_bandwidth.md); the price is at most 31 zero columns per sequence.

Key order (KEY_ORDERS): "natural" puts a sequence's token j in its column j; "sm90_pv", for the
sm90 CUDA kernel, permutes the tokens inside every complete 16-token group of a sequence so that
the group's column i holds its token SM90_PV_KEY_ORDER[i], the order in which that kernel's
threads hold P's keys (docs/attention_kernel_sm90.md, "P in registers"); an incomplete last
group stays in natural order. Also a layout only: the same bytes in other columns.
"""

import functools
from typing import List

import torch
import torch.nn.functional as F

__all__ = [
    "ALIGN_COLUMNS", "SPAN_COLUMNS", "aligned_column_starts", "aligned_column_starts_list",
    "aligned_width_bound", "dense_column_starts", "dense_needs_alignment", "dense_offsets",
    "KEY_ORDERS",
    "SM90_PV_KEY_ORDER", "key_order_columns",
]  # fmt: skip

ALIGN_COLUMNS = 16  # 16 E4M3 bytes: a TMA box's start alignment
SPAN_COLUMNS = 32  # the aligned layout's sequence spans: multiples of a 32-byte DRAM sector
KEY_ORDERS = ("natural", "sm90_pv")
# Column i of a complete 16-token group holds token SM90_PV_KEY_ORDER[i] of the group: lane q
# of a quad holds keys 2 q, 2 q + 1, 8 + 2 q, 9 + 2 q of the group in the kernel's P fragment.
SM90_PV_KEY_ORDER = (0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15)


def key_order_columns(span: int, key_order: str) -> torch.Tensor:
    """[span] int64: the token (0 .. span - 1 of one sequence) that each of the sequence's
    columns holds in `key_order`; the identity for "natural"."""
    if key_order not in KEY_ORDERS:
        raise ValueError(f"key_order must be one of {KEY_ORDERS}, got {key_order!r}")
    tokens = torch.arange(span)
    if key_order == "sm90_pv":
        complete = span // ALIGN_COLUMNS * ALIGN_COLUMNS
        order = torch.tensor(SM90_PV_KEY_ORDER)
        groups = tokens[:complete].view(-1, ALIGN_COLUMNS)
        tokens[:complete] = (groups[:, :1] + order).reshape(-1)
    return tokens


def _round_up(x):
    return -(-x // SPAN_COLUMNS) * SPAN_COLUMNS


def aligned_column_starts_list(starts: List[int]) -> List[int]:
    """[num_seqs + 1] each sequence's first column in the aligned layout, then its width."""
    columns = [0]
    for a, b in zip(starts, starts[1:]):
        columns.append(columns[-1] + _round_up(b - a))
    return columns


def aligned_width_bound(tokens: int, num_seqs: int) -> int:
    """The widest aligned layout of num_seqs sequences of `tokens` tokens in all (each sequence
    rounds up by at most SPAN_COLUMNS - 1 columns): a width for it without reading the starts."""
    return _round_up(tokens + num_seqs * (SPAN_COLUMNS - 1))


def aligned_column_starts(starts: torch.Tensor) -> torch.Tensor:
    """aligned_column_starts_list on the device: [num_seqs + 1] int32 on starts' device, without
    a host sync."""
    slots = (starts[1:] - starts[:-1] + SPAN_COLUMNS - 1) // SPAN_COLUMNS * SPAN_COLUMNS
    return F.pad(torch.cumsum(slots, 0, dtype=torch.int32), (1, 0))


def dense_needs_alignment(batch: int, seqlen: int) -> bool:
    """Whether a dense V8^T needs the aligned layout: sample n's first token n * seqlen is off
    the ALIGN_COLUMNS grid (batch > 1 and seqlen % ALIGN_COLUMNS != 0)."""
    return batch > 1 and seqlen % ALIGN_COLUMNS != 0


def dense_column_starts(batch: int, seqlen: int, device: torch.device, aligned: bool):
    """[batch + 1] int32 on `device`: the first column of each dense sample (token index n *
    seqlen, or with `aligned` n times seqlen rounded up to SPAN_COLUMNS), then the end. Cached
    (dense_offsets): read-only."""
    step = _round_up(seqlen) if aligned else seqlen
    return dense_offsets(batch, step, device)


def dense_offsets(batch: int, step: int, device: torch.device) -> torch.Tensor:
    """[batch + 1] int32 n * step on `device` (dense samples' first tokens or columns).

    Cached per (batch, step, device) (read-only: callers must not modify it), which saves a few
    small kernels of host overhead per call; not while a CUDA graph is being captured, where a
    new tensor would be filled only by the graph's replays."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return _dense_offsets(batch, step, device)
    return _cached_dense_offsets(batch, step, device)


def _dense_offsets(batch, step, device):
    return torch.arange(batch + 1, dtype=torch.int32, device=device) * step


_cached_dense_offsets = functools.lru_cache(maxsize=64)(_dense_offsets)
