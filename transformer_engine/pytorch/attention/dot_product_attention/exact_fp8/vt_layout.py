"""Where each sequence's keys sit in V8^T, the FP8 V operand of the attention kernel.

The V quantizer writes V8^T [h_kv, d, t_pad] with a key in the column of its token index. The
kernel reads FP8 V^T tiles through TMA boxes, which start on 16-byte (16-column) boundaries, so it
needs every sequence to start on a multiple of ALIGN_COLUMNS. When some sequence does not (a thd
pack with arbitrary cu_seqlens, or dense samples whose length is not a multiple of 16),
align_sequence_columns moves the columns: sequence n's go to [vt_starts[n], vt_starts[n] + span),
each span rounded up to ALIGN_COLUMNS, and the columns between them are 0. Values and scales are
unchanged: this is a copy, not a quantization decision.
"""

from typing import List, NamedTuple, Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

__all__ = [
    "ALIGN_COLUMNS", "AlignedLayout", "aligned_layout", "aligned_column_starts",
    "align_sequence_columns",
]  # fmt: skip

ALIGN_COLUMNS = 16  # 16 E4M3 bytes: a TMA box's start alignment


def _round_up(x):
    return -(-x // ALIGN_COLUMNS) * ALIGN_COLUMNS


class AlignedLayout(NamedTuple):
    width: int  # columns of the aligned V8^T (a multiple of ALIGN_COLUMNS, > 0)
    widest_slot: int  # the largest rounded-up span


def aligned_layout(starts: List[int]) -> Optional[AlignedLayout]:
    """starts [num_seqs + 1]: the sequences' first tokens, then the end of the last. None if every
    sequence starts on a multiple of ALIGN_COLUMNS, else the layout of the sequences laid end to
    end with each span rounded up to a multiple of ALIGN_COLUMNS (some span is then not 0)."""
    if all(x % ALIGN_COLUMNS == 0 for x in starts[:-1]):
        return None
    slots = [_round_up(b - a) for a, b in zip(starts, starts[1:])]
    return AlignedLayout(sum(slots), max(slots))


def aligned_column_starts(starts: torch.Tensor) -> torch.Tensor:
    """[num_seqs + 1] int32 on starts' device (no host sync): each sequence's first column in the
    aligned layout (the last entry: its width)."""
    slots = (starts[1:] - starts[:-1] + ALIGN_COLUMNS - 1) // ALIGN_COLUMNS * ALIGN_COLUMNS
    return F.pad(torch.cumsum(slots, 0, dtype=torch.int32), (1, 0))


@triton.jit
def _move_columns_kernel(
    SRC, DST, STARTS, VT_STARTS, n_rows, src_cols, src_stride, dst_stride,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Columns [c0, c0 + BLOCK_C) of sequence program_id(1)'s aligned slot, rows of one block:
    DST[r, vt_start + c] = SRC[r, start + c] for c < span, 0 for span <= c < slot (bytes)."""
    seq = tl.program_id(1)
    c0 = tl.program_id(2) * BLOCK_C
    start = tl.load(STARTS + seq)
    span = tl.load(STARTS + seq + 1) - start
    vt_start = tl.load(VT_STARTS + seq)
    slot = tl.load(VT_STARTS + seq + 1) - vt_start
    if c0 >= slot:
        return
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = c0 + tl.arange(0, BLOCK_C)
    rows_ok = rows[:, None] < n_rows
    src = SRC + rows[:, None].to(tl.int64) * src_stride + start + cols[None, :]
    x = tl.load(src, mask=rows_ok & (cols[None, :] < span) & (start + cols[None, :] < src_cols))
    x = tl.where(cols[None, :] < span, x, 0)
    dst = DST + rows[:, None].to(tl.int64) * dst_stride + vt_start + cols[None, :]
    tl.store(dst, x, mask=rows_ok & (cols[None, :] < slot))


def align_sequence_columns(
    v8t: torch.Tensor, starts: torch.Tensor, vt_starts: torch.Tensor, layout: AlignedLayout
) -> torch.Tensor:
    """V8^T [h_kv, d, t_pad] -> [h_kv, d, layout.width], sequence n's columns moved to
    vt_starts[n] (aligned_column_starts(starts)); starts [num_seqs + 1] int32 on v8t's device:
    the sequences' first tokens (their columns in v8t). CUDA tensors, or CPU ones under
    TRITON_INTERPRET=1 (as the attention kernel)."""
    h, d, t_pad = v8t.shape
    src = v8t.view(torch.uint8).reshape(h * d, t_pad)
    out = torch.empty(h * d, layout.width, dtype=torch.uint8, device=v8t.device)
    block_r, block_c = 32, 256
    grid = (
        triton.cdiv(h * d, block_r),
        starts.numel() - 1,
        triton.cdiv(layout.widest_slot, block_c),
    )
    _move_columns_kernel[grid](
        src, out, starts, vt_starts, h * d, t_pad, src.stride(0), out.stride(0),
        BLOCK_R=block_r, BLOCK_C=block_c,
    )  # fmt: skip
    return out.reshape(h, d, layout.width).view(v8t.dtype)
