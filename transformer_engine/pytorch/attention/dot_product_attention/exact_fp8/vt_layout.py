"""Where each sequence's keys sit in V8^T, the FP8 V operand of the attention kernel.

The V quantizer writes V8^T [h_kv, d, t_pad] with a key in the column of its token index. The
kernel reads FP8 V^T tiles through TMA boxes, which start on 16-byte (16-column) boundaries, so it
needs every sequence to start on a multiple of ALIGN_COLUMNS. When some sequence does not (a thd
pack with arbitrary cu_seqlens, or dense samples whose length is not a multiple of 16),
align_sequence_columns moves the columns: sequence n's go to [vt_starts[n], vt_starts[n] + span),
each span rounded up to ALIGN_COLUMNS, and the columns between them are 0. Values and scales are
unchanged: this is a copy, not a quantization decision.
"""

from typing import List, Optional

import torch
import triton
import triton.language as tl

__all__ = ["ALIGN_COLUMNS", "aligned_width", "aligned_column_starts", "align_sequence_columns"]

ALIGN_COLUMNS = 16  # 16 E4M3 bytes: a TMA box's start alignment


def _round_up(x):
    return -(-x // ALIGN_COLUMNS) * ALIGN_COLUMNS


def aligned_width(starts: List[int]) -> Optional[int]:
    """starts [num_seqs + 1]: the sequences' first tokens, then the end of the last. None if every
    sequence starts on a multiple of ALIGN_COLUMNS, else the columns that the sequences take when
    laid end to end with each span rounded up to a multiple of ALIGN_COLUMNS."""
    if all(x % ALIGN_COLUMNS == 0 for x in starts[:-1]):
        return None
    return sum(_round_up(b - a) for a, b in zip(starts, starts[1:]))


def aligned_column_starts(starts: torch.Tensor) -> torch.Tensor:
    """[num_seqs + 1] int32 on starts' device (no host sync): each sequence's first column when
    laid end to end with spans rounded up to ALIGN_COLUMNS (the last entry: aligned_width)."""
    spans = _round_up(starts[1:] - starts[:-1])
    return torch.cat([starts.new_zeros(1), spans.cumsum(0)]).to(torch.int32)


def _source_columns(starts, vt_starts, width, src_width) -> torch.Tensor:
    """[width] int32: the source column of each new column, -1 where the new column is 0."""
    num_seqs = starts.numel() - 1
    col = torch.arange(width, device=starts.device, dtype=torch.int32)
    seq = torch.searchsorted(vt_starts[1:], col, right=True).clamp_(max=num_seqs - 1)
    offset = col - vt_starts[seq]
    src = starts[seq] + offset
    keep = (offset < starts[seq + 1] - starts[seq]) & (src < src_width)
    return torch.where(keep, src, -1).to(torch.int32)


@triton.jit
def _gather_columns_kernel(
    SRC, DST, COLS, n_rows, n_cols, src_stride, dst_stride,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """DST[r, c] = SRC[r, COLS[c]] (0 where COLS[c] < 0), bytes, one [BLOCK_R, BLOCK_C] block."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    src_cols = tl.load(COLS + cols, mask=cols < n_cols, other=-1)
    rows_ok = rows[:, None] < n_rows
    src = SRC + rows[:, None].to(tl.int64) * src_stride + src_cols[None, :]
    x = tl.load(src, mask=rows_ok & (src_cols[None, :] >= 0), other=0)
    dst = DST + rows[:, None].to(tl.int64) * dst_stride + cols[None, :]
    tl.store(dst, x, mask=rows_ok & (cols[None, :] < n_cols))


def align_sequence_columns(
    v8t: torch.Tensor, starts: torch.Tensor, vt_starts: torch.Tensor, width: int
) -> torch.Tensor:
    """V8^T [h_kv, d, t_pad] -> [h_kv, d, width] with sequence n's columns moved to vt_starts[n].

    starts, vt_starts [num_seqs + 1] int32 on v8t's device: the sequences' first token (their
    columns in v8t) and their new first column (multiples of ALIGN_COLUMNS, width the last).
    """
    h, d, t_pad = v8t.shape
    cols = _source_columns(starts, vt_starts, width, t_pad)
    src = v8t.view(torch.uint8).reshape(h * d, t_pad)
    if not v8t.is_cuda:  # the CPU (torch) path of the quantizer
        data = src.index_select(1, cols.clamp(min=0).long()) * (cols >= 0).to(torch.uint8)
        return data.reshape(h, d, width).view(v8t.dtype)
    out = torch.empty(h * d, width, dtype=torch.uint8, device=v8t.device)
    grid = (triton.cdiv(h * d, 32), triton.cdiv(width, 256))
    _gather_columns_kernel[grid](
        src, out, cols, h * d, width, src.stride(0), out.stride(0), BLOCK_R=32, BLOCK_C=256
    )
    return out.reshape(h, d, width).view(v8t.dtype)
