"""Mask-exact FP8 attention forward, Triton kernel. The launcher is triton/attention.py.

One program computes BM query rows (BM in BLOCK_M_CHOICES, a divisor of Q_TILE = 128; a launch
parameter like num_warps) of one (sequence, head):

  t = (Q8 . K8^T) * k_scale[j]                 (column-scaled raw scores, fp32)
  S = t * row_scale[i], row_scale = q_scale[i] * softmax_scale * log2(e)   (log2 units)
  online softmax in fp32 with exp2; P = 2^(S - m + log2(P_SCALE)) = P_SCALE * softmax numerator

over the KV tiles (BLOCK_N = KV_TILE = 128 positions) that masking.kv_tile_ranges returns:
boundary tiles are masked element-wise and multiply P (in the input dtype) with the unquantized V,
in sub-tiles of BOUNDARY_N = 64 positions of which those hidden from the whole block are skipped;
FP8 tiles are unmasked and multiply P cast to E4M3 with the FP8 V. For current scaling a tile's
V scale is one scalar (its chunk's, per kv-head), folded into the accumulator's per-row rescale:
acc is kept in units of the last FP8 tile's V scale and multiplied back once at the end (Note [V
scale in the rescale] in formats.py), so the MMA accumulates straight into acc. The
FP8/unquantized decision is taken per (Q_TILE, KV_TILE) pair, as masks.fp8_tile_map, whatever
BM is. P_SCALE is folded into the exponent, so l and acc
carry the same factor and it cancels in acc / l (only the LSE subtracts it); row_scale > 0 is
folded into the exponent's FMA (max_j(t * r) = r * max_j(t) exactly, rounding is monotonic). See
Note [Mask-exact FP8 scaling] in formats.py for why this keeps every output row independent of
what its mask hides.

Recipes (RECIPE_MX):
  current  Q/K: one E4M3 scale per token (per_token_cast_to_fp8), V: one per 128-token chunk
  MXFP8    Q/K: E8M0 per 32 along d, V: E8M0 per (32-token chunk, channel). sm90 has no block-
           scaled MMA, so the scales are applied explicitly and exactly: one FP8 sub-dot per
           32-wide block of the contraction dim, times the fp32 power-of-two scales; row_scale is
           softmax_scale * log2(e) alone. The launcher decodes K's and V's E8M0 codes to fp32
           (formats.e8m0_to_float, exact: 2^(code - 127), code 0 the subnormal 2^-127, 255 NaN),
           so the hot loop loads scales instead of decoding a code per thread and column.

Layouts: Q, V and O are addressed through (batch, token, head) strides (d contiguous), so bshd,
sbhd and thd need no copies; K8, V8^T, the scales and the LSE are token-major along the flattened
(b, s) axis. Block sizes are constants, never tuned: the output does not depend on a tuning choice
other than num_warps/num_stages, which change no decision.
"""

import math

import triton
import triton.language as tl

from ..formats import FP32_MAX, KV_TILE, MX_BLOCK, P_SCALE, Q_TILE, V_CHUNK_CURRENT
from .masking import boundary_subtile_ranges, kv_tile_ranges, sequence_geometry, visible
from .scaling import (
    e8m0_to_fp32,
    per_block_cast_to_mxfp8,
    per_token_cast_to_fp8,
)

__all__ = ["attention_forward_kernel", "BLOCK_M_CHOICES", "BLOCK_N", "BOUNDARY_N", "Q_TILE"]

# Runtime scalars that take many values (lengths, windows, flags): compiled once, not per value.
_RUNTIME_SCALARS = [
    "stride_qsh", "stride_ksh", "stride_lh", "num_heads", "kv_group", "dense_span_q",
    "dense_span_kv", "window_left", "window_right", "varlen", "bottom_right", "power_2",
]  # fmt: skip

BLOCK_M_CHOICES = (64, 128)  # query rows per program: one or two warpgroups' MMA rows
# Boundary loops run one or two tiles per program: a shallow pipeline keeps their staging buffers
# (K8 and the 16-bit V tile) small, so two programs fit on an SM next to the FP8 loop's buffers.
BOUNDARY_STAGES = tl.constexpr(2)
BLOCK_N = KV_TILE
# Boundary tiles run in sub-tiles of this many positions; a sub-tile that no row of the program
# sees is skipped (half of the diagonal tile for the first 64 rows of a query tile). A constant:
# it fixes the order of the online softmax's steps, so it is part of what the output bits are.
BOUNDARY_N = 64
LOG2_P_SCALE = tl.constexpr(int(math.log2(P_SCALE)))
MX_BLOCK_C = tl.constexpr(MX_BLOCK)
V_CHUNK_C = tl.constexpr(V_CHUNK_CURRENT)
LN2 = tl.constexpr(math.log(2.0))
FP32_MAX_C = tl.constexpr(FP32_MAX)
assert 2**LOG2_P_SCALE.value == P_SCALE and BLOCK_N % MX_BLOCK == 0
assert BLOCK_N == V_CHUNK_CURRENT  # one current-scaling V scale per FP8 KV tile
assert BLOCK_N % BOUNDARY_N == 0 and BOUNDARY_N % MX_BLOCK == 0
assert all(Q_TILE % block_m == 0 for block_m in BLOCK_M_CHOICES)


@triton.jit
def _query_tile_current(
    Q, q_off, Q_SCALE, qs_off, rows_in, offs_d, scores_scale, amax_epsilon, power_2,
    QUANTIZE_Q: tl.constexpr,
):  # fmt: skip
    """(q8 [BM, D] e4m3, row scale [BM] fp32 = q_scale_inv * softmax_scale * log2(e))."""
    ptrs = Q + q_off[:, None] + offs_d[None, :]
    if QUANTIZE_Q:
        x = tl.load(ptrs, mask=rows_in[:, None], other=0.0).to(tl.float32)
        q8, q_scale_inv = per_token_cast_to_fp8(x, amax_epsilon, power_2)
    else:
        q8 = tl.load(ptrs, mask=rows_in[:, None], other=0.0)
        q_scale_inv = tl.load(Q_SCALE + qs_off, mask=rows_in, other=1.0)
    return q8, q_scale_inv * scores_scale


@triton.jit
def _query_tile_mx(
    Q, q_off, Q_SCALE, qs_off, rows_in, HEAD_DIM: tl.constexpr, QUANTIZE_Q: tl.constexpr
):
    """Tuples over the d // 32 MX blocks: (q8 [BM, 32] e4m3, scale [BM] fp32 = 2^(code - 127))."""
    offs_c = tl.arange(0, MX_BLOCK_C)
    q8 = ()
    q_scale = ()
    for g in tl.static_range(HEAD_DIM // MX_BLOCK_C):
        ptrs = Q + q_off[:, None] + g * MX_BLOCK_C + offs_c[None, :]
        if QUANTIZE_Q:
            x = tl.load(ptrs, mask=rows_in[:, None], other=0.0).to(tl.float32)
            data, code = per_block_cast_to_mxfp8(x)
        else:
            data = tl.load(ptrs, mask=rows_in[:, None], other=0.0)
            code = tl.load(Q_SCALE + qs_off + g, mask=rows_in, other=127)
        q8 = q8 + (data,)
        q_scale = q_scale + (e8m0_to_fp32(code),)
    return q8, q_scale


@triton.jit
def _scores(
    q8, q_scale, k_tile, ks_tile, k_desc, k_row, col0, len_kv,
    HEAD_DIM: tl.constexpr, BN: tl.constexpr, RECIPE_MX: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """[BM, BN] fp32 column-scaled scores t of one KV tile (S = t * row_scale).

    k_tile: the tile's first key row of K8 ([t, d] slice of the head); ks_tile: its scale
    ([t] fp32 scale_inv, or [t, d // 32] fp32 decoded E8M0 for MXFP8). q_scale: the MX blocks'
    scales (unused for current scaling, whose Q scale is in row_scale). On masked tiles keys
    past the sequence's real length (col0 + j >= len_kv) load as 0; the mask drops them anyway.
    k_desc: TMA descriptor of K8 as [h_kv * t, d]; k_row (int32): the tile's first row in it.
    Complete current-scaling tiles load K through it (no per-thread address arithmetic).
    """
    offs_n = tl.arange(0, BN)
    cols_ok = col0 + offs_n < len_kv
    if RECIPE_MX:
        n_blocks: tl.constexpr = HEAD_DIM // MX_BLOCK_C
        offs_c = tl.arange(0, MX_BLOCK_C)
        s = tl.zeros([q8[0].shape[0], BN], tl.float32)
        for g in tl.static_range(n_blocks):
            k_ptrs = k_tile + offs_n[None, :] * HEAD_DIM + g * MX_BLOCK_C + offs_c[:, None]
            scale_ptrs = ks_tile + offs_n * n_blocks + g
            if MASKED:
                k_t = tl.load(k_ptrs, mask=cols_ok[None, :], other=0.0)  # [32, BN]
                k_scale = tl.load(scale_ptrs, mask=cols_ok, other=1.0)  # [BN]
            else:
                k_t = tl.load(k_ptrs)
                k_scale = tl.load(scale_ptrs)
            s += tl.dot(q8[g], k_t) * (q_scale[g][:, None] * k_scale[None, :])
    else:
        offs_d = tl.arange(0, HEAD_DIM)
        k_ptrs = k_tile + offs_n[None, :] * HEAD_DIM + offs_d[:, None]  # [D, BN], d contiguous
        if MASKED:
            k_t = tl.load(k_ptrs, mask=cols_ok[None, :], other=0.0)
            k_scale_inv = tl.load(ks_tile + offs_n, mask=cols_ok, other=0.0)  # [BN]
        else:
            k_t = k_desc.load([k_row, 0]).T  # [D, BN]
            k_scale_inv = tl.load(ks_tile + offs_n)
        s = tl.dot(q8, k_t) * k_scale_inv[None, :]
    return s


@triton.jit
def _column_blocks(x, N: tl.constexpr):
    """x [rows, N * 32] -> tuple of its N [rows, 32] column blocks, in order (N = 2 or 4)."""
    rows: tl.constexpr = x.shape[0]
    if N == 2:
        lo, hi = tl.split(tl.permute(tl.reshape(x, (rows, 2, MX_BLOCK_C)), (0, 2, 1)))
        return lo, hi
    else:
        tl.static_assert(N == 4)
        # [rows, 32, hi, lo] with column = hi * 64 + lo * 32 + c
        x4 = tl.permute(tl.reshape(x, (rows, 2, 2, MX_BLOCK_C)), (0, 3, 1, 2))
        lo0, lo1 = tl.split(x4)
        b0, b2 = tl.split(lo0)
        b1, b3 = tl.split(lo1)
        return b0, b1, b2, b3


@triton.jit
def _pv_fp8(
    acc, p, vt_tile, v_scales, vt_desc, vt_row, vt_col, col0, len_kv, stride_vtd,
    HEAD_DIM: tl.constexpr, BN: tl.constexpr, RECIPE_MX: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """acc + P8 . V8 [BM, D] fp32: for current scaling in units of the tile's V scale (Note [V
    scale in the rescale]: the caller rescaled acc into them), for MXFP8 with each 32-token
    block's per-channel scales applied to its product.

    vt_tile: the tile's first column in the head's V8^T [d, t_pad] (tokens contiguous: the K-major
    operand of the FP8 MMA; a multiple of 16 columns); v_scales: MXFP8 only, a pointer to the
    tile's first block's row of V_SCALE [n_chunks, d]. Only the leaky fp8_v_everywhere mode runs
    this on masked tiles.
    vt_desc: TMA descriptor of V8^T as [h_kv * d, t_pad] with [d, BN] boxes; (vt_row, vt_col)
    int32: the tile's corner in it, read by current scaling (MXFP8 reads pointers, one 32-token
    block at a time). On the leaky mode's masked tiles the box also reads keys past len_kv (the
    zero columns after the sequence, or the next sequence's): their P is exactly 0.
    """
    # See Note [Mask-exact FP8 scaling]: P's scale is the fixed P_SCALE, folded into p already.
    p8 = p.to(tl.float8e4nv)
    if RECIPE_MX:
        p_blocks = _column_blocks(p8, BN // MX_BLOCK_C)
        offs_d = tl.arange(0, HEAD_DIM)
        offs_c = tl.arange(0, MX_BLOCK_C)
        for blk in tl.static_range(BN // MX_BLOCK_C):
            cols = blk * MX_BLOCK_C + offs_c
            vt_ptrs = vt_tile + offs_d[:, None] * stride_vtd + cols[None, :]  # [D, 32]
            # Plain [D] loads: loading them as int64 pairs in the accumulator's layout (what
            # the v1 current-scaling path did) waited longer than the exchange here (0.7x).
            scale_ptrs = v_scales + blk * HEAD_DIM + offs_d  # [D]
            if MASKED:
                v_t = tl.load(vt_ptrs, mask=col0 + cols[None, :] < len_kv, other=0.0)
                v_scale = tl.load(scale_ptrs, mask=col0 + blk * MX_BLOCK_C < len_kv, other=1.0)
            else:
                v_t = tl.load(vt_ptrs)
                v_scale = tl.load(scale_ptrs)
            acc += tl.dot(p_blocks[blk], tl.trans(v_t)) * v_scale[None, :]
    else:
        v_t = vt_desc.load([vt_row, vt_col])  # [D, BN]; masked tiles too (P is 0 past len_kv)
        # Each tile's P8 . V8 in a fresh fp32 product, added on the CUDA cores: accumulating into
        # acc inside the MMA made ptxas serialize the WGMMAs (advisory C7513) and ran 1.04-1.05x
        # slower on the H200; the fp32 add also keeps O's sum out of the tensor cores' reduced
        # accumulation precision (benchmarks/results/v_scale_rules.md).
        acc += tl.dot(p8, tl.trans(v_t))
    return acc


@triton.jit
def _pv_unquantized(
    acc, p, v_tile, stride_vs, col0, len_kv, HEAD_DIM: tl.constexpr, BN: tl.constexpr
):
    """acc + P . V with P in V's dtype (bf16/fp16) and the tile's unquantized V [BN, D].

    v_tile: the tile's first key in V's own layout. Keys past len_kv load as 0.
    """
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, HEAD_DIM)
    v_ptrs = v_tile + offs_n[:, None] * stride_vs + offs_d[None, :]
    v = tl.load(v_ptrs, mask=col0 + offs_n[:, None] < len_kv, other=0.0)
    return tl.dot(p.to(v_tile.dtype.element_ty), v, acc)


@triton.jit
def _v_tile_scale(vs_head, chunk_kv, col0, RECIPE_MX: tl.constexpr, V_FP8: tl.constexpr):
    """The tile's V unit (Note [V scale in the rescale]): its chunk's scale_inv (fp32 scalar,
    V_SCALE [h_kv, n_chunks]) for current-scaling FP8 V; 1 for unquantized V and for MXFP8,
    whose scales are applied per element."""
    if V_FP8 and not RECIPE_MX:
        return tl.load(vs_head + chunk_kv + col0 // V_CHUNK_C)
    else:
        return tl.full([], 1.0, tl.float32)


# A row whose running max m (log2 units) reaches 2^16 is a huge row: it subtracts its max in the
# score domain. The one-FMA exponent t * row_scale + (8 - m_ref) (the compiler contracts it)
# gives the row's largest score 8 + e, |e| <= ulp(m_ref): below 2^16 p_max rounds to 256 in E4M3
# and the row sum is off by <= 0.27 % (under one bf16 ulp); from ~2^20 P8 of the max moves off
# 256, from 2^23 it may saturate, beyond ~2^31 exp2 overflows (a NaN output). The decision
# depends on the row's own visible scores only. The sm90 CUDA kernel applies the same rule
# (softmax.h, kHugeRow).
HUGE_ROW = tl.constexpr(65536.0)


@triton.jit
def _huge_row(m):
    return (tl.abs(m) >= HUGE_ROW) & (m != float("-inf"))


@triton.jit
def _unit_ratio(v_unit, tile_unit, RECIPE_MX: tl.constexpr):
    """u / s_j of Note [V scale in the rescale], clamped to FP32_MAX; exactly 1 when the units
    are equal (the boundary sub-tiles of one chunk, whatever BM skips) and for MXFP8. tl.fdiv:
    within 2 ulp; a correctly rounded division (div_rn) brings a slow-path call that tripled
    the 64-row program's spills (offline sm_90a compile: 376 against 136 bytes)."""
    if RECIPE_MX:
        return tl.full([], 1.0, tl.float32)
    else:
        ratio = tl.minimum(tl.fdiv(v_unit, tile_unit), FP32_MAX_C)
        return tl.where(v_unit == tile_unit, 1.0, ratio)


@triton.jit
def _attend_tiles(
    acc, l_i, m_i, t_i, v_unit, q8, q_scale, row_scale, rows, kv_first, kv_end, kv_seq, window,
    HEAD_DIM: tl.constexpr, BN: tl.constexpr, RECIPE_MX: tl.constexpr, MASKED: tl.constexpr,
    V_FP8: tl.constexpr, LOOP_STAGES: tl.constexpr,
):  # fmt: skip
    """Online softmax over the BN-key tiles [kv_first, kv_end) of a sequence
    -> (acc, l_i, m_i, t_i, v_unit).

    v_unit (fp32 scalar): the V scale acc is kept in (Note [V scale in the rescale]; 1 before
    any current-scaling FP8 tile and for MXFP8).

    kv_seq: the sequence's keys and values for this kv head, the tuple (k8_head, ks_head,
    vt_head, vs_head, v_seq, tok_kv, vt_col0, chunk_kv, stride_vtd, stride_vs, k_desc, vt_desc,
    k_desc_row, vt_desc_row, len_kv); window: (diag, left, right) of triton.masking.visible.
    *_head: the kv head's slices of K8, K_SCALE, V8T, V_SCALE; v_seq: the sequence's first key
    in V's layout; tok_kv (int64): its token-major index; vt_col0 (int32, a multiple of 16): its
    column in V8^T; chunk_kv: its first V chunk. k_desc, vt_desc: TMA descriptors of K8
    [h_kv * t, d] and V8^T [h_kv * d, t_pad] (boxes of BN keys); k_desc_row (int32): the
    sequence's first key row in k_desc for this kv head; vt_desc_row (int32): the kv head's first
    row in vt_desc.
    row_scale [BM] > 0: S = t * row_scale. m_i: running row max of S (-inf: nothing seen yet);
    t_i: that of t (m_i = fl(row_scale * t_i)).
    LOOP_STAGES: the loop's software pipeline depth (None: the launch's num_stages).
    """
    k8_head, ks_head, vt_head, vs_head, v_seq, tok_kv, vt_col0, chunk_kv = kv_seq[:8]
    stride_vtd, stride_vs, k_desc, vt_desc, k_desc_row, vt_desc_row, len_kv = kv_seq[8:]
    diag, left, right = window
    scale_cols: tl.constexpr = HEAD_DIM // MX_BLOCK_C if RECIPE_MX else 1
    for kt in tl.range(kv_first, kv_end, num_stages=LOOP_STAGES):
        col0 = kt * BN
        tok = tok_kv + col0
        # Read first: the scale's load latency then runs under the scores and the softmax.
        tile_unit = _v_tile_scale(vs_head, chunk_kv, col0, RECIPE_MX, V_FP8)
        v_scales = vs_head + (chunk_kv + col0 // MX_BLOCK_C).to(tl.int64) * HEAD_DIM  # MXFP8
        t = _scores(
            q8, q_scale, k8_head + tok * HEAD_DIM, ks_head + tok * scale_cols,
            k_desc, k_desc_row + col0, col0, len_kv, HEAD_DIM, BN, RECIPE_MX, MASKED,
        )  # fmt: skip
        if MASKED:
            cols = col0 + tl.arange(0, BN)
            t = tl.where(visible(rows, cols, len_kv, diag, left, right), t, float("-inf"))
        t_tile = tl.max(t, 1)
        m_new = tl.maximum(m_i, t_tile * row_scale)
        t_new = tl.maximum(t_i, t_tile)
        if MASKED:  # rows that have seen nothing yet keep m = -inf: exponentiate against 0
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            t_ref = tl.where(t_new == float("-inf"), 0.0, t_new)
        else:
            m_ref = m_new
            t_ref = t_new
        # P_SCALE * softmax numerator: p = exp2(fma(t, row_scale, 8 - m_ref)), except in huge
        # rows (_huge_row), which subtract the max in the score domain: exact at the max.
        huge_prev = _huge_row(m_i)
        huge = _huge_row(m_new)
        t_sub = tl.where(huge, t_ref, 0.0)
        bias = tl.where(huge, LOG2_P_SCALE, LOG2_P_SCALE - m_ref)
        p = tl.math.exp2(tl.fma(t - t_sub[:, None], row_scale[:, None], bias[:, None]))
        # 2^(old reference - new reference); the reference is m_ref, or row_scale * t_ref exactly
        # in a huge row.
        alpha = tl.math.exp2(
            tl.where(
                huge,
                tl.where(huge_prev, (t_i - t_ref) * row_scale, tl.fma(-row_scale, t_ref, m_i)),
                tl.where(huge_prev, tl.fma(row_scale, t_i, -m_ref), m_i - m_ref),
            )
        )
        l_i = l_i * alpha + tl.sum(p, 1)
        # See Note [V scale in the rescale]: acc moves into the units of this tile's V scale.
        acc = acc * (alpha * _unit_ratio(v_unit, tile_unit, RECIPE_MX))[:, None]
        v_unit = tile_unit
        if V_FP8:
            acc = _pv_fp8(
                acc, p, vt_head + vt_col0 + col0, v_scales, vt_desc, vt_desc_row, vt_col0 + col0,
                col0, len_kv, stride_vtd, HEAD_DIM, BN, RECIPE_MX, MASKED,
            )  # fmt: skip
        else:
            v_tile = v_seq + col0.to(tl.int64) * stride_vs
            acc = _pv_unquantized(acc, p, v_tile, stride_vs, col0, len_kv, HEAD_DIM, BN)
        m_i = m_new
        t_i = t_new
    return acc, l_i, m_i, t_i, v_unit


@triton.jit(do_not_specialize=_RUNTIME_SCALARS)
def attention_forward_kernel(
    Q, Q_SCALE, K8, K_SCALE, V8T, V_SCALE, V, O, LSE, K_DESC, VT_DESC, VT_DESC_B,
    CU_Q, CU_Q_START, CU_KV, CU_KV_START, CU_CHUNKS, CU_VT,
    stride_qb, stride_qs, stride_qh, stride_qsh,
    stride_kh, stride_ksh, stride_vth, stride_vtd, stride_vsh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, stride_lh,
    num_heads, kv_group, dense_span_q, dense_span_kv, window_left, window_right,
    varlen, bottom_right, power_2, scores_scale, amax_epsilon,
    HEAD_DIM: tl.constexpr, RECIPE_MX: tl.constexpr, QUANTIZE_Q: tl.constexpr,
    FP8_V_EVERYWHERE: tl.constexpr, BM: tl.constexpr,
    BN: tl.constexpr, BNB: tl.constexpr, QT: tl.constexpr,
):  # fmt: skip
    """Grid (num_seqs * num_heads, query blocks of BM rows), the heaviest (last) blocks first.
    thd: blocks for max_seqlen_q rows (the launcher does not read the offsets); the rows of a
    longer (padded) allocation past them are padding, written by the last block (0, LSE -inf).

    Q: [.., d] in its layout (strides b/s/h), or pre-quantized token-major [h, t, d] e4m3
    (QUANTIZE_Q False) with Q_SCALE [h, t] fp32 scale_inv ([h, t, d // 32] E8M0 for MXFP8).
    K8 [h_kv, t, d] e4m3, K_SCALE [h_kv, t] fp32 scale_inv ([h_kv, t, d // 32] fp32 2^(e - 127)).
    V8T [h_kv, d, t_pad] e4m3, V_SCALE [h_kv, n_chunks] fp32 scale_inv (one per chunk and
    kv-head; MXFP8: [h_kv, n_chunks, d] fp32 2^(e - 127)).
    K_DESC, VT_DESC: TMA descriptors of K8 as [h_kv * t, d] (block [BN, d]) and of V8T as
    [h_kv * d, t_pad] (block [d, BN]), read by the complete tiles of current scaling; VT_DESC_B:
    V8T's with [d, BNB] boxes, for the boundary sub-tiles of the leaky mode (FP8_V_EVERYWHERE;
    unread otherwise, where the launcher passes VT_DESC).
    V: unquantized, in its layout. O: Q's shape and layout. LSE [h, t_q] fp32, natural log.
    CU_CHUNKS [num_seqs + 1] int32: first V chunk of each sequence; CU_VT: its first column in
    V8T (a multiple of 16: vt_layout.py lays V8T out so). scores_scale:
    softmax_scale * log2(e). window_*: TE's window_size sides, kernel_masking.UNBOUNDED for -1.
    varlen, bottom_right, power_2: 0/1 flags (thd, diagonal from the real lengths' difference,
    power-of-two Q scales).
    """
    pid = tl.program_id(0)
    seq = pid // num_heads
    head = pid % num_heads
    kv_head = head // kv_group
    q_lo = (tl.num_programs(1) - 1 - tl.program_id(1)) * BM
    start_q, len_q, span_q, start_kv, len_kv, span_kv = sequence_geometry(
        seq, CU_Q, CU_Q_START, CU_KV, CU_KV_START, dense_span_q, dense_span_kv, varlen
    )
    if q_lo >= span_q:
        return
    diag = tl.where(bottom_right != 0, len_kv - len_q, 0)

    rows = q_lo + tl.arange(0, BM)
    rows_in = rows < span_q
    tok_kv = start_kv.to(tl.int64)  # token-major index of the sequence's first key
    tok_q = start_q.to(tl.int64) + rows  # token-major index of each row
    # Q and V in their layouts: sample offset (dense; stride_*b is 0 for thd) + token offset.
    row_q = tl.where(varlen != 0, tok_q, rows.to(tl.int64))
    q_off = seq.to(tl.int64) * stride_qb + row_q * stride_qs + head * stride_qh
    first_kv = tl.where(varlen != 0, tok_kv, 0)
    v_seq = V + seq.to(tl.int64) * stride_vb + first_kv * stride_vs + kv_head * stride_vh
    scale_cols: tl.constexpr = HEAD_DIM // MX_BLOCK_C if RECIPE_MX else 1
    qs_off = head.to(tl.int64) * stride_qsh + tok_q * scale_cols  # pre-quantized Q's scales
    if RECIPE_MX:
        q8, q_scale = _query_tile_mx(Q, q_off, Q_SCALE, qs_off, rows_in, HEAD_DIM, QUANTIZE_Q)
        row_scale = tl.full([BM], scores_scale, tl.float32)
    else:
        q8, row_scale = _query_tile_current(
            Q, q_off, Q_SCALE, qs_off, rows_in, tl.arange(0, HEAD_DIM), scores_scale,
            amax_epsilon, power_2, QUANTIZE_Q,
        )  # fmt: skip
        q_scale = row_scale  # in row_scale already

    kv_lo, fp8_lo, fp8_hi, kv_hi = kv_tile_ranges(
        q_lo, len_q, len_kv, diag, window_left, window_right, BM, QT, BN
    )
    right_lo, right_hi, left_lo, left_hi = boundary_subtile_ranges(
        q_lo, len_q, len_kv, diag, window_left, window_right, kv_lo, fp8_lo, fp8_hi, kv_hi,
        BM, BN, BNB,
    )  # fmt: skip
    k8_head = K8 + kv_head.to(tl.int64) * stride_kh
    ks_head = K_SCALE + kv_head.to(tl.int64) * stride_ksh
    vt_head = V8T + kv_head.to(tl.int64) * stride_vth
    vs_head = V_SCALE + kv_head.to(tl.int64) * stride_vsh
    chunk_kv = tl.load(CU_CHUNKS + seq)
    k_desc_row = (kv_head * (stride_kh // HEAD_DIM) + tok_kv).to(tl.int32)  # K8 rows: h_kv * t
    vt_desc_row = kv_head * HEAD_DIM
    acc = tl.zeros([BM, HEAD_DIM], tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    t_i = tl.full([BM], float("-inf"), tl.float32)
    v_unit = tl.full([], 1.0, tl.float32)  # the V scale acc is in: Note [V scale in the rescale]
    vt_col0 = tl.multiple_of(tl.load(CU_VT + seq), 16)  # 16-byte aligned V8^T rows: TMA boxes
    kv_head_data = (
        k8_head, ks_head, vt_head, vs_head, v_seq, tok_kv, vt_col0, chunk_kv, stride_vtd, stride_vs
    )  # fmt: skip
    kv_seq = kv_head_data + (K_DESC, VT_DESC, k_desc_row, vt_desc_row, len_kv)
    kv_seq_b = kv_head_data + (K_DESC, VT_DESC_B, k_desc_row, vt_desc_row, len_kv)
    window = (diag, window_left, window_right)
    # Right boundary (diagonal / sequence end) first, so that its loads are not left exposed at
    # the end of the program, then the left boundary (sliding window) and the FP8 tiles.
    acc, l_i, m_i, t_i, v_unit = _attend_tiles(
        acc, l_i, m_i, t_i, v_unit, q8, q_scale, row_scale, rows, right_lo, right_hi, kv_seq_b, window,
        HEAD_DIM, BNB, RECIPE_MX, True, FP8_V_EVERYWHERE, BOUNDARY_STAGES,
    )  # fmt: skip
    acc, l_i, m_i, t_i, v_unit = _attend_tiles(
        acc, l_i, m_i, t_i, v_unit, q8, q_scale, row_scale, rows, left_lo, left_hi, kv_seq_b, window,
        HEAD_DIM, BNB, RECIPE_MX, True, FP8_V_EVERYWHERE, BOUNDARY_STAGES,
    )  # fmt: skip
    acc, l_i, m_i, t_i, v_unit = _attend_tiles(
        acc, l_i, m_i, t_i, v_unit, q8, q_scale, row_scale, rows, fp8_lo, fp8_hi, kv_seq, window,
        HEAD_DIM, BN, RECIPE_MX, False, True, None,
    )  # fmt: skip

    # Rows past the sequence's real length, and rows that see nothing (l = 0 exactly), give 0
    # and LSE -inf; a NaN l (a NaN score the row sees) gives NaN, as BF16 attention does.
    seen = (rows < len_q) & (l_i != 0.0)
    # acc times 1 / l (correctly rounded once per row), then back from the units of the last V
    # scale (Note [V scale in the rescale]: acc / l <= 448 cannot overflow, the product is the
    # output's magnitude)
    inv_l = tl.math.div_rn(tl.full([BM], 1.0, tl.float32), tl.where(seen, l_i, 1.0))
    out = (acc * inv_l[:, None]) * v_unit
    out = tl.where(seen[:, None], out, 0.0)
    lse = tl.where(seen, (m_i + tl.math.log2(l_i) - LOG2_P_SCALE) * LN2, float("-inf"))
    out_rows = (
        O, LSE, span_q, seq, head, start_q, varlen, stride_ob, stride_os, stride_oh, stride_lh
    )  # fmt: skip
    _store_rows(out, lse, rows, out_rows, HEAD_DIM)
    if tl.program_id(1) == 0:
        # thd: the grid covers max_seqlen_q rows of each sequence; a padded allocation's rows
        # past them see nothing (they are past the real length) and are written here.
        zeros = tl.zeros([BM, HEAD_DIM], tl.float32)
        no_keys = tl.full([BM], float("-inf"), tl.float32)
        for row0 in range(tl.num_programs(1) * BM, span_q, BM):
            _store_rows(zeros, no_keys, row0 + tl.arange(0, BM), out_rows, HEAD_DIM)


@triton.jit
def _store_rows(out, lse, rows, out_rows, HEAD_DIM: tl.constexpr):
    """out [BM, D] and lse [BM] into O and LSE at the sequence's rows `rows` below its span.

    out_rows: (O, LSE, span_q, seq, head, start_q, varlen, stride_ob, stride_os, stride_oh,
    stride_lh), as attention_forward_kernel's."""
    O, LSE, span_q, seq, head, start_q, varlen = out_rows[:7]
    stride_ob, stride_os, stride_oh, stride_lh = out_rows[7:]
    rows_in = rows < span_q
    tok_q = start_q.to(tl.int64) + rows  # token-major index of each row
    row_o = tl.where(varlen != 0, tok_q, rows.to(tl.int64))  # O in its layout, as Q
    o_off = seq.to(tl.int64) * stride_ob + row_o * stride_os + head * stride_oh
    o_ptrs = O + o_off[:, None] + tl.arange(0, HEAD_DIM)[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=rows_in[:, None])
    tl.store(LSE + head.to(tl.int64) * stride_lh + tok_q, lse, mask=rows_in)
