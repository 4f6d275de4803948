"""In-kernel mask geometry of mask-exact FP8 attention (Triton JIT helpers), mirroring masks.py.

For one block of query rows (BLOCK_M rows of one sequence, inside one Q_TILE) the KV tiles
(KV_TILE positions) fall into three contiguous ranges, computed from scalars only (no data):

    [kv_lo, fp8_lo)   boundary tiles: element-wise mask, unquantized V
    [fp8_lo, fp8_hi)  FP8 tiles: complete, and every real row of the Q_TILE sees all of it
    [fp8_hi, kv_hi)   boundary tiles: element-wise mask, unquantized V

Tiles outside [kv_lo, kv_hi) are hidden from every row of the block and are skipped. The FP8
range is exactly the True entries of masks.fp8_tile_map for the enclosing Q_TILE (see
Note [Mask-exact FP8 scaling] in formats.py): because a row's visible window [i + diag - left,
i + diag + right] moves right with i, a tile is visible to all real rows iff it is visible to the
first row on its right edge and to the last real row on its left edge.

The boundary tiles are walked in sub-tiles of SUB_TILE positions (boundary_subtile_ranges): a
boundary tile is often half hidden from the whole block (the diagonal tile of a causal block of
64 rows in a 128-row query tile), and its hidden sub-tiles are skipped. That changes no FP8
decision: a boundary sub-tile multiplies the unquantized V like its tile.

The backward (triton/backward_kernel.py) walks the same geometry the other way round as well:
for a block of key columns, the blocks of query rows that see some of it (row_block_ranges);
for a block of query rows, the blocks of key columns it sees (column_block_ranges). Both split
the blocks into [lo, full_lo) masked, [full_lo, full_hi) fully visible (no element mask) and
[full_hi, hi) masked; visible_pairs is the element mask of the masked ones, padding included.

Window sides are passed as ints with UNBOUNDED for "no bound" (TE's -1), so no branch is needed.
"""

import triton
import triton.language as tl

__all__ = [
    "UNBOUNDED", "sequence_geometry", "kv_tile_ranges", "boundary_subtile_ranges", "visible",
    "row_block_ranges", "column_block_ranges", "visible_pairs", "visible_pairs_t",
]  # fmt: skip

UNBOUNDED = 1 << 30
"""A window side with no bound. Row/column indices plus or minus it stay inside int32."""


@triton.jit
def sequence_geometry(
    seq, CU_Q, CU_Q_START, CU_KV, CU_KV_START, dense_span_q, dense_span_kv, varlen
):
    """(start, len, span) along the flattened token axis for the queries and keys of `seq`.

    CU_* [num_seqs + 1] int32: CU_Q/CU_KV give the real lengths, CU_*_START the first token of
    each sequence (thd: cu_seqlens_*_padded, or cu_seqlens_* when unpadded). Dense layouts
    (varlen 0) allocate dense_span_* tokens per sample.
    """
    len_q = tl.load(CU_Q + seq + 1) - tl.load(CU_Q + seq)
    len_kv = tl.load(CU_KV + seq + 1) - tl.load(CU_KV + seq)
    if varlen:
        start_q = tl.load(CU_Q_START + seq)
        span_q = tl.load(CU_Q_START + seq + 1) - start_q
        start_kv = tl.load(CU_KV_START + seq)
        span_kv = tl.load(CU_KV_START + seq + 1) - start_kv
    else:
        start_q = seq * dense_span_q
        span_q = dense_span_q
        start_kv = seq * dense_span_kv
        span_kv = dense_span_kv
    return start_q, len_q, span_q, start_kv, len_kv, span_kv


@triton.jit
def _visible_columns(q_lo, len_q, len_kv, diag, left, right, BLOCK_M: tl.constexpr):
    """(q_last, col_lo, col_hi): the block's last real row (< q_lo: none) and the positions
    [col_lo, col_hi) that its real rows see between them (contiguous: windows move with i)."""
    q_last = tl.minimum(q_lo + BLOCK_M, len_q) - 1
    col_lo = tl.maximum(q_lo + diag - left, 0)
    col_hi = tl.minimum(q_last + diag + right + 1, len_kv)
    return q_last, col_lo, col_hi


@triton.jit
def kv_tile_ranges(
    q_lo, len_q, len_kv, diag, left, right,
    BLOCK_M: tl.constexpr, Q_TILE: tl.constexpr, KV_TILE: tl.constexpr,
):  # fmt: skip
    """(kv_lo, fp8_lo, fp8_hi, kv_hi) KV tile indices for the BLOCK_M query rows from q_lo.

    Row i sees position j iff j < len_kv and i + diag - left <= j <= i + diag + right, for real
    rows i < len_q. [kv_lo, kv_hi): the tiles some real row of the block sees (empty when none
    does). [fp8_lo, fp8_hi): the FP8 tiles, decided for the whole enclosing Q_TILE (BLOCK_M
    divides Q_TILE), so that the decision does not depend on the kernel's block size.
    """
    q_last, col_lo, col_hi = _visible_columns(q_lo, len_q, len_kv, diag, left, right, BLOCK_M)
    kv_lo = col_lo // KV_TILE
    kv_hi = tl.where((q_last >= q_lo) & (col_hi > col_lo), tl.cdiv(col_hi, KV_TILE), kv_lo)
    # See Note [Mask-exact FP8 scaling]: complete tiles that every real row of the query tile
    # sees entirely. They lie inside [kv_lo, kv_hi) whenever the block has a real row.
    tile_lo = q_lo // Q_TILE * Q_TILE
    tile_last = tl.minimum(tile_lo + Q_TILE, len_q) - 1
    fp8_lo = tl.cdiv(tl.maximum(tile_last + diag - left, 0), KV_TILE)
    fp8_hi = tl.minimum(len_kv // KV_TILE, tl.maximum(tile_lo + diag + right + 1, 0) // KV_TILE)
    fp8_lo = tl.minimum(tl.maximum(fp8_lo, kv_lo), kv_hi)
    fp8_hi = tl.minimum(tl.maximum(fp8_hi, fp8_lo), kv_hi)
    return kv_lo, fp8_lo, fp8_hi, kv_hi


@triton.jit
def boundary_subtile_ranges(
    q_lo, len_q, len_kv, diag, left, right, kv_lo, fp8_lo, fp8_hi, kv_hi,
    BLOCK_M: tl.constexpr, KV_TILE: tl.constexpr, SUB_TILE: tl.constexpr,
):  # fmt: skip
    """(right_lo, right_hi, left_lo, left_hi): SUB_TILE-position sub-tile indices of the right
    boundary tiles [fp8_hi, kv_hi) and of the left ones [kv_lo, fp8_lo) (kv_tile_ranges), less
    the sub-tiles that no real row of the block sees. SUB_TILE divides KV_TILE."""
    per_tile: tl.constexpr = KV_TILE // SUB_TILE
    _, col_lo, col_hi = _visible_columns(q_lo, len_q, len_kv, diag, left, right, BLOCK_M)
    sub_lo = col_lo // SUB_TILE
    sub_hi = tl.cdiv(col_hi, SUB_TILE)
    right_lo, right_hi = _clip(fp8_hi * per_tile, kv_hi * per_tile, sub_lo, sub_hi)
    left_lo, left_hi = _clip(kv_lo * per_tile, fp8_lo * per_tile, sub_lo, sub_hi)
    return right_lo, right_hi, left_lo, left_hi


@triton.jit
def _clip(lo, hi, keep_lo, keep_hi):
    """[lo, hi) intersected with [keep_lo, keep_hi), as a range inside [lo, hi) (lo <= hi)."""
    new_lo = tl.minimum(tl.maximum(lo, keep_lo), hi)
    return new_lo, tl.minimum(hi, tl.maximum(keep_hi, new_lo))


@triton.jit
def visible(rows, cols, len_kv, diag, left, right):
    """[rows, cols] bool: may row i see position j (masks.allowed_positions for real rows).

    Row i sees the interval [i + diag - left, min(i + diag + right, len_kv - 1)]: two compares
    per element against per-row bounds.
    """
    first = rows + diag - left  # [rows]
    last = tl.minimum(rows + diag + right, len_kv - 1)
    return (cols[None, :] >= first[:, None]) & (cols[None, :] <= last[:, None])


@triton.jit
def row_block_ranges(
    n0, len_q, len_kv, diag, left, right, BM: tl.constexpr, BN: tl.constexpr
):  # fmt: skip
    """(lo, full_lo, full_hi, hi): query row block starts (multiples of BM) for the key columns
    [n0, n0 + BN) of a sequence, as the backward's dK/dV program walks them.

    [lo, hi): the blocks with a real row that sees some real column of the block (empty when
    none does). [full_lo, full_hi) inside it: the blocks whose every row is real and sees every
    column (all columns real too), which need no element mask. Column j is seen by the rows
    i in [j - diag - right, j - diag + left] (i < len_q). Mask geometry only, no data.
    """
    n_last = tl.minimum(n0 + BN, len_kv) - 1  # the block's last real column (< n0: none)
    row_lo = tl.maximum(n0 - diag - right, 0)
    row_hi = tl.minimum(n_last - diag + left + 1, len_q)
    some = (n_last >= n0) & (row_hi > row_lo)
    lo = tl.where(some, row_lo // BM * BM, 0)
    hi = tl.where(some, tl.cdiv(row_hi, BM) * BM, lo)
    # every row of a block sees the block's last column: m0 >= n0 + BN - 1 - diag - right;
    # and its first column: m0 + BM - 1 <= n0 - diag + left; every row real: m0 + BM <= len_q
    full_lo = tl.cdiv(tl.maximum(n0 + BN - 1 - diag - right, 0), BM) * BM
    full_hi = tl.minimum(tl.maximum(n0 - diag + left + 1, 0) // BM * BM, len_q // BM * BM)
    full_hi = tl.where(n0 + BN <= len_kv, full_hi, 0)  # every column real
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def column_block_ranges(
    m0, len_q, len_kv, diag, left, right, BM: tl.constexpr, BN: tl.constexpr
):  # fmt: skip
    """(lo, full_lo, full_hi, hi): key column block starts (multiples of BN) for the query rows
    [m0, m0 + BM) of a sequence, as the backward's dQ program walks them.

    [lo, hi): the blocks with a real column that some real row of the block sees (empty when
    none does). [full_lo, full_hi) inside it: the blocks whose every column is real and seen by
    every row (all rows real too), which need no element mask. Mask geometry only, no data.
    """
    q_last, col_lo, col_hi = _visible_columns(m0, len_q, len_kv, diag, left, right, BM)
    some = (q_last >= m0) & (col_hi > col_lo)
    lo = tl.where(some, col_lo // BN * BN, 0)
    hi = tl.where(some, tl.cdiv(col_hi, BN) * BN, lo)
    # every column seen by the block's last row: n0 >= m0 + BM - 1 + diag - left; by its first
    # row: n0 + BN - 1 <= m0 + diag + right; every column real: n0 + BN <= len_kv
    full_lo = tl.cdiv(tl.maximum(m0 + BM - 1 + diag - left, 0), BN) * BN
    full_hi = tl.minimum(tl.maximum(m0 + diag + right + 1, 0) // BN * BN, len_kv // BN * BN)
    full_hi = tl.where(m0 + BM <= len_q, full_hi, 0)  # every row real
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def visible_pairs(rows, cols, len_q, len_kv, diag, left, right):
    """[rows, cols] bool: may real row i see real position j (masks.allowed_positions over the
    spans: padding rows and columns see nothing). rows, cols: int32 index vectors."""
    first = rows + diag - left
    last = tl.minimum(rows + diag + right, len_kv - 1)
    ok = (cols[None, :] >= first[:, None]) & (cols[None, :] <= last[:, None])
    return ok & (rows < len_q)[:, None]


@triton.jit
def visible_pairs_t(cols, rows, len_q, len_kv, diag, left, right):
    """visible_pairs transposed, built in place: [cols, rows] bool."""
    first = rows + diag - left
    last = tl.minimum(rows + diag + right, len_kv - 1)
    ok = (cols[:, None] >= first[None, :]) & (cols[:, None] <= last[None, :])
    return ok & (rows < len_q)[None, :]
