"""Mask-exact FP8 attention backward, Triton kernels. The launcher is triton/backward.py.

The gradients are those of the attention of the forward's quantized Q and K (the straight-through
estimate, Note [Backward of the FP8 forward] in te/autograd.py), computed from the forward's own
FP8 operands: the scores are recomputed from Q8, K8 and their scales with the forward kernel's
arithmetic (attention_kernel._scores: the FP8 product, times the key scales, times the row scale;
MXFP8: one FP8 sub-dot per 32-channel block times its two power-of-two scales, summed in block
order), so they are the scores the forward's LSE came from, and P = 2^(S - LSE) <= 1 up to the
rounding of the LSE and of the MMA's accumulation order. Three kernels:

  backward_preprocess_kernel  D = rowsum(dO * O) and the LSE in log2 units, per (head, row)
  backward_dkdv_kernel        one program per (sequence, kv head, BN keys): dK, dV, looping over
                              the query heads of its group and the query row blocks that see them
  backward_dq_kernel          one program per (sequence, head, BM query rows): dQ, looping over
                              the key blocks the rows see

  S  = scores of the FP8 operands (log2 units)     P  = 2^min(S - LSE2, 0)   (0 where hidden)
  dV = P^T . dO       dP = dO . V^T       dS = P * (dP - D)   (0 where hidden)
  dQ = dS . K_dq * softmax_scale          dK = dS^T . Q_dq * softmax_scale

with V and dO unquantized (the input dtype), P, dS and the dequantized Q_dq, K_dq rounded to the
input dtype for the 16-bit MMAs, fp32 accumulation. Every sum runs in an order fixed by the mask
geometry and the block sizes (no atomics): the gradients are deterministic, and the block sizes
are constants per (recipe, head dim), never tuned at run time.

Mask-exactness (DESIGN.md section 2, docs/backward.md):
  * a position a row may not see is never loaded where it is padding (loads are masked with the
    sequences' real lengths) and is removed with tl.where, never by a multiplication, so an
    Inf or NaN there cannot become Inf * 0 = NaN;
  * P is clamped to [0, 1] and a NaN exponent (inf - inf: a row whose forward overflowed) gives
    P = 0, so a row with dO = 0 contributes exactly 0 to every dK and dV, whatever its scores;
  * D = rowsum of dO * O over the elements where dO != 0 (tl.where), so a row with dO = 0 has
    D = 0 even where its forward output is not finite;
  * rows that see nothing have LSE2 = +inf, hence P = 0 and zero gradients.

GUARDS=False is the LEAKY emulation of the backward this one replaced, for negative controls
only: scores from the dequantized Q and K in the input dtype (not the FP8 operands), no clamp,
masks applied by multiplication, D unguarded, padding loaded (up to each sequence's allocation).
"""

import math

import triton
import triton.language as tl

from ..formats import MX_BLOCK
from .masking import (
    column_block_ranges,
    row_block_ranges,
    sequence_geometry,
    visible_pairs,
    visible_pairs_t,
)

__all__ = [
    "backward_preprocess_kernel",
    "backward_dkdv_kernel",
    "backward_dq_kernel",
    "dequantize_rows_kernel",
]

_RUNTIME_SCALARS = [
    "num_heads", "num_kv_heads", "kv_group", "dense_span_q", "dense_span_kv", "window_left",
    "window_right", "varlen", "bottom_right",
]  # fmt: skip
MX_BLOCK_C = tl.constexpr(MX_BLOCK)
LOG2E = tl.constexpr(1.0 / math.log(2.0))


# ------------------------------------------------------------------------------- operands


@triton.jit
def _load_fp8_rows(X8, XS, tok, ok, HEAD_DIM: tl.constexpr, RECIPE_MX: tl.constexpr):
    """FP8 rows of one head of a token-major operand ([t, d] e4m3 at X8, scales at XS).

    Current scaling: (data [R, D] e4m3, scale_inv [R] fp32). MXFP8: tuples over the d // 32
    blocks of (data [R, 32] e4m3) and (scale [R] fp32, 2^(code - 127) decoded by the launcher).
    Rows with ok False load 0 (data) and 0 (scale)."""
    if RECIPE_MX:
        n_blocks: tl.constexpr = HEAD_DIM // MX_BLOCK_C
        offs_c = tl.arange(0, MX_BLOCK_C)
        data = ()
        scale = ()
        for g in tl.static_range(n_blocks):
            ptrs = X8 + tok[:, None] * HEAD_DIM + g * MX_BLOCK_C + offs_c[None, :]
            data = data + (tl.load(ptrs, mask=ok[:, None], other=0.0),)
            scale = scale + (tl.load(XS + tok * n_blocks + g, mask=ok, other=0.0),)
        return data, scale
    else:
        offs_d = tl.arange(0, HEAD_DIM)
        data = tl.load(X8 + tok[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0)
        return data, tl.load(XS + tok, mask=ok, other=0.0)


@triton.jit
def _dequantize(data, scale, dtype: tl.constexpr, RECIPE_MX: tl.constexpr):
    """The dequantized operand (data * scale) rounded to the 16-bit dtype of the MMAs: one
    tensor [R, D] for current scaling, a tuple of [R, 32] blocks for MXFP8 (exact there: an
    E4M3 value times a power of two, unless it falls under the dtype's subnormals).

    Saturated to the dtype's finite range (NaN kept): an MXFP8 block scale rounds up to a power
    of two, so a dequantized element can reach twice its block's amax (65504 in fp16 is
    256 * 2^8 = 65536 after the round trip; near BF16's max, 2^128), and an infinite operand
    would turn the exact zeros of hidden positions into 0 * inf = NaN in the MMA."""
    if RECIPE_MX:
        out = ()
        for g in tl.static_range(len(data)):
            out = out + (_saturate(data[g].to(tl.float32) * scale[g][:, None], dtype),)
        return out
    else:
        return _saturate(data.to(tl.float32) * scale[:, None], dtype)


@triton.jit
def _saturate(x, dtype: tl.constexpr):
    """fp32 -> dtype, saturating to its largest finite value (NaN stays NaN)."""
    if dtype == tl.float16:
        big = 65504.0
    else:
        big = 3.3895313892515355e38  # the largest finite bfloat16
    return tl.clamp(x, -big, big, propagate_nan=tl.PropagateNan.ALL).to(dtype)


@triton.jit
def _scores(
    a8, a_scale, b8, b_scale, row_scale, scores_scale,
    KEYS_FIRST: tl.constexpr, RECIPE_MX: tl.constexpr,
):  # fmt: skip
    """[A, B] fp32 scores in log2 units of the FP8 rows a8 against the FP8 rows b8, with the
    forward kernel's arithmetic (attention_kernel._scores, then the row scale of its exp2).

    KEYS_FIRST: a = keys, b = queries (dK/dV: [keys, queries]); else a = queries, b = keys (dQ).
    Current scaling: t = (Q8 . K8^T) * key scale_inv, S = t * row_scale, row_scale [queries] =
    q_scale_inv * softmax_scale * log2(e) (computed by the caller as the forward does).
    MXFP8: S = (sum over blocks g, in order, of (a8_g . b8_g^T) * (a_scale_g * b_scale_g)) *
    scores_scale; row_scale is unused.
    """
    if RECIPE_MX:
        s = tl.zeros([a8[0].shape[0], b8[0].shape[0]], tl.float32)
        for g in tl.static_range(len(a8)):
            s += tl.dot(a8[g], tl.trans(b8[g])) * (a_scale[g][:, None] * b_scale[g][None, :])
        return s * scores_scale
    else:
        t = tl.dot(a8, tl.trans(b8))
        if KEYS_FIRST:
            return (t * a_scale[:, None]) * row_scale[None, :]
        else:
            return (t * b_scale[None, :]) * row_scale[:, None]


@triton.jit
def _dequantized_scores(a_dq, b_dq, scores_scale, RECIPE_MX: tl.constexpr):
    """LEAKY emulation only (GUARDS=False): the scores of the dequantized operands in the input
    dtype, as the cuDNN backward this kernel replaced recomputed them."""
    if RECIPE_MX:
        s = tl.zeros([a_dq[0].shape[0], b_dq[0].shape[0]], tl.float32)
        for g in tl.static_range(len(a_dq)):
            s += tl.dot(a_dq[g], tl.trans(b_dq[g]))
        return s * scores_scale
    else:
        return tl.dot(a_dq, tl.trans(b_dq)) * scores_scale


@triton.jit
def _probabilities(s, lse2, vis, LSE_ON_ROWS: tl.constexpr, MASKED: tl.constexpr,
                   GUARDS: tl.constexpr):  # fmt: skip
    """P = 2^(S - LSE2) in [0, 1]; 0 where hidden (vis False; read only when MASKED) and where
    S - LSE2 is NaN. LSE_ON_ROWS: lse2 runs along s's rows ([queries, keys], dQ) or along its
    columns ([keys, queries], dK/dV)."""
    if LSE_ON_ROWS:
        x = s - lse2[:, None]
    else:
        x = s - lse2[None, :]
    if GUARDS:
        # P <= 1 by construction up to rounding: clamp the exponent at 0; NaN gives P = 0
        if MASKED:
            x = tl.where(vis & (x <= 0.0), x, tl.where(vis & (x > 0.0), 0.0, float("-inf")))
        else:
            x = tl.where(x <= 0.0, x, tl.where(x > 0.0, 0.0, float("-inf")))
        return tl.math.exp2(x)
    else:
        p = tl.math.exp2(x)
        if MASKED:
            p = p * vis.to(tl.float32)
        return p


@triton.jit
def _mask_ds(ds, vis, MASKED: tl.constexpr, GUARDS: tl.constexpr):
    if MASKED:
        if GUARDS:
            ds = tl.where(vis, ds, 0.0)
        else:
            ds = ds * vis.to(tl.float32)
    return ds


@triton.jit
def _accumulate(acc, a, b, RECIPE_MX: tl.constexpr):
    """acc + a . b, b one tensor [K, D] (acc [M, D]) or, for MXFP8, a tuple of [K, 32] blocks
    (acc a tuple of [M, 32] blocks)."""
    if RECIPE_MX:
        out = ()
        for g in tl.static_range(len(b)):
            out = out + (tl.dot(a, b[g], acc[g]),)
        return out
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _zeros_like_operand(rows: tl.constexpr, HEAD_DIM: tl.constexpr, RECIPE_MX: tl.constexpr):
    if RECIPE_MX:
        out = ()
        for g in tl.static_range(HEAD_DIM // MX_BLOCK_C):
            out = out + (tl.zeros([rows, MX_BLOCK_C], tl.float32),)
        return out
    else:
        return tl.zeros([rows, HEAD_DIM], tl.float32)


@triton.jit
def _store_grad(acc, ptrs_base, ok, scale, HEAD_DIM: tl.constexpr, RECIPE_MX: tl.constexpr):
    """acc * scale into the rows at ptrs_base ([R] pointers to each row's first channel)."""
    dtype = ptrs_base.dtype.element_ty
    if RECIPE_MX:
        offs_c = tl.arange(0, MX_BLOCK_C)
        for g in tl.static_range(HEAD_DIM // MX_BLOCK_C):
            ptrs = ptrs_base[:, None] + g * MX_BLOCK_C + offs_c[None, :]
            tl.store(ptrs, (acc[g] * scale).to(dtype), mask=ok[:, None])
    else:
        ptrs = ptrs_base[:, None] + tl.arange(0, HEAD_DIM)[None, :]
        tl.store(ptrs, (acc * scale).to(dtype), mask=ok[:, None])


@triton.jit
def _layout_rows(X, seq, tok, rows, varlen, stride_b, stride_s, stride_h, head):
    """[R] pointers to the first channel of rows `rows` (token-major index `tok`) of a tensor in
    its qkv layout (bshd/sbhd: sample `seq`, position `rows`; thd: token `tok`)."""
    row = tl.where(varlen != 0, tok, rows.to(tl.int64))
    return X + seq.to(tl.int64) * stride_b + row * stride_s + head.to(tl.int64) * stride_h


# ------------------------------------------------------------------------------- D and LSE2


@triton.jit(do_not_specialize=_RUNTIME_SCALARS)
def backward_preprocess_kernel(
    O, DO, LSE, DELTA, LSE2, CU_Q, CU_Q_START, CU_KV, CU_KV_START,
    stride_ob, stride_os, stride_oh, stride_dob, stride_dos, stride_doh, stride_lh,
    num_heads, dense_span_q, dense_span_kv, varlen,
    HEAD_DIM: tl.constexpr, BM: tl.constexpr, GUARDS: tl.constexpr,
):  # fmt: skip
    """Grid (num_seqs * num_heads, query blocks of BM rows). DELTA, LSE2 [h, t_q] fp32:
    D = rowsum(dO * O) over the elements with dO != 0, and LSE * log2(e) with +inf for rows
    that see nothing (LSE -inf); padding rows (past the real length, inside the allocation)
    get D = 0 and LSE2 = +inf. O, DO in q's layout (strides b/s/h); LSE [h, t_q] natural log."""
    pid = tl.program_id(0)
    seq = pid // num_heads
    head = pid % num_heads
    start_q, len_q, span_q, _, _, _ = sequence_geometry(
        seq, CU_Q, CU_Q_START, CU_KV, CU_KV_START, dense_span_q, dense_span_kv, varlen
    )
    m0 = tl.program_id(1) * BM
    if m0 >= span_q:
        return
    rows = m0 + tl.arange(0, BM)
    if GUARDS:
        real = rows < len_q
    else:
        real = rows < span_q
    tok = start_q.to(tl.int64) + rows
    offs_d = tl.arange(0, HEAD_DIM)
    o_rows = _layout_rows(O, seq, tok, rows, varlen, stride_ob, stride_os, stride_oh, head)
    do_rows = _layout_rows(DO, seq, tok, rows, varlen, stride_dob, stride_dos, stride_doh, head)
    o = tl.load(o_rows[:, None] + offs_d[None, :], mask=real[:, None], other=0.0).to(tl.float32)
    do = tl.load(do_rows[:, None] + offs_d[None, :], mask=real[:, None], other=0.0)
    do = do.to(tl.float32)
    if GUARDS:
        prod = tl.where(do != 0.0, do * o, 0.0)  # dO = 0: no contribution, whatever O holds
    else:
        prod = do * o
    delta = tl.sum(prod, 1)
    lse = tl.load(LSE + head.to(tl.int64) * stride_lh + tok, mask=real, other=float("-inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
    keep = rows < span_q
    tl.store(DELTA + head.to(tl.int64) * stride_lh + tok, tl.where(real, delta, 0.0), mask=keep)
    tl.store(LSE2 + head.to(tl.int64) * stride_lh + tok, lse2, mask=keep)


@triton.jit
def dequantize_rows_kernel(X8, SCALE, OUT, num_rows, HEAD_DIM: tl.constexpr, BR: tl.constexpr):
    """Grid (rows / BR). OUT [R, d] (bf16 or fp16) = X8 [R, d] e4m3 * SCALE [R] fp32 (scale_inv
    per row), in fp32 and saturated to OUT's range: _dequantize's operands of dK and dQ, for the
    CUDA backward (cuda/backward.py), which reads them from memory."""
    rows = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    ok = rows < num_rows
    offs = rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    x = tl.load(X8 + offs, mask=ok[:, None], other=0.0).to(tl.float32)
    scale = tl.load(SCALE + rows, mask=ok, other=0.0)
    tl.store(OUT + offs, _saturate(x * scale[:, None], OUT.dtype.element_ty), mask=ok[:, None])


# ------------------------------------------------------------------------------- dK, dV


@triton.jit
def _dkdv_row_blocks(
    dk, dv, k8, k_scale, k_dq, v, cols, m_lo, m_hi, q_heads, geo,
    HEAD_DIM: tl.constexpr, RECIPE_MX: tl.constexpr, BM: tl.constexpr,
    MASKED: tl.constexpr, GUARDS: tl.constexpr,
):  # fmt: skip
    """dK, dV of one key block over the query row blocks [m_lo, m_hi) of every query head of
    its group: one flat loop, head-major (a loop over the heads around a loop over the blocks
    held more registers than the 8-warp program has; offline sm_90a compile, docs/backward.md).

    q_heads: (Q8, Q_SCALE, DO, DELTA, LSE2, the group's first head, kv_group, their head
    strides, dO's (batch, token, head) strides); geo: (seq, start_q, len_q, span_q, len_kv,
    diag, left, right, varlen, scores_scale)."""
    Q8, QS, DO, DELTA, LSE2, head0, kv_group = q_heads[:7]
    stride_q8h, stride_qsh, stride_lh, stride_dob, stride_dos, stride_doh = q_heads[7:]
    seq, start_q, len_q, span_q, len_kv, diag, left, right, varlen, scores_scale = geo
    dtype = v.dtype
    if GUARDS:
        lim_q = len_q
    else:
        lim_q = span_q
    n_blocks = (m_hi - m_lo) // BM
    for it in tl.range(0, n_blocks * kv_group):
        g = it // n_blocks
        head = head0 + g
        m0 = m_lo + (it - g * n_blocks) * BM
        rows = m0 + tl.arange(0, BM)
        ok = rows < lim_q
        tok = start_q.to(tl.int64) + rows
        q8, q_scale = _load_fp8_rows(
            Q8 + head.to(tl.int64) * stride_q8h, QS + head.to(tl.int64) * stride_qsh, tok, ok,
            HEAD_DIM, RECIPE_MX,
        )  # fmt: skip
        do_rows = _layout_rows(DO, seq, tok, rows, varlen, stride_dob, stride_dos, stride_doh, head)
        do = tl.load(
            do_rows[:, None] + tl.arange(0, HEAD_DIM)[None, :], mask=ok[:, None], other=0.0
        )
        lse2 = tl.load(LSE2 + head.to(tl.int64) * stride_lh + tok, mask=ok, other=float("inf"))
        delta = tl.load(DELTA + head.to(tl.int64) * stride_lh + tok, mask=ok, other=0.0)
        q_dq = _dequantize(q8, q_scale, dtype, RECIPE_MX)
        if GUARDS:
            if RECIPE_MX:
                row_scale = q_scale  # unused
            else:
                row_scale = q_scale * scores_scale  # the forward's row scale
            s_t = _scores(k8, k_scale, q8, q_scale, row_scale, scores_scale, True, RECIPE_MX)
        else:
            s_t = _dequantized_scores(k_dq, q_dq, scores_scale, RECIPE_MX)
        vis_t = visible_pairs_t(cols, rows, len_q, len_kv, diag, left, right)  # if MASKED
        p_t = _probabilities(s_t, lse2, vis_t, False, MASKED, GUARDS)  # [BN, BM]
        dv = tl.dot(p_t.to(dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = _mask_ds(p_t * (dp_t - delta[None, :]), vis_t, MASKED, GUARDS)
        dk = _accumulate(dk, ds_t.to(dtype), q_dq, RECIPE_MX)
    return dk, dv


@triton.jit(do_not_specialize=_RUNTIME_SCALARS)
def backward_dkdv_kernel(
    Q8, Q_SCALE, K8, K_SCALE, V, DO, DK, DV, DELTA, LSE2,
    CU_Q, CU_Q_START, CU_KV, CU_KV_START,
    stride_q8h, stride_qsh, stride_k8h, stride_ksh,
    stride_vb, stride_vs, stride_vh, stride_dob, stride_dos, stride_doh,
    stride_gb, stride_gs, stride_gh, stride_lh,
    num_heads, num_kv_heads, kv_group, dense_span_q, dense_span_kv, window_left, window_right,
    varlen, bottom_right, scores_scale, softmax_scale,
    HEAD_DIM: tl.constexpr, RECIPE_MX: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    GUARDS: tl.constexpr,
):  # fmt: skip
    """Grid (num_seqs * num_kv_heads, key blocks of BN). dK, dV of BN keys of one (sequence, kv
    head), summed over the kv_group query heads of the group in head order (GQA/MQA), each over
    its query row blocks in order: masked blocks, fully visible blocks, masked blocks
    (masking.row_block_ranges).

    Q8 [h, t_q, d] e4m3 token-major, Q_SCALE [h, t_q] fp32 scale_inv ([h, t_q, d // 32] fp32
    2^(e - 127) for MXFP8); K8, K_SCALE likewise over [h_kv, t_kv]. V, DO, DK/DV: their layouts
    (strides b/s/h; DK and DV share k's shape and strides). DELTA, LSE2 [h, t_q] fp32 from the
    preprocess kernel. scores_scale = softmax_scale * log2(e), as the forward's.
    Keys past the real length (inside the allocation) get dK = dV = 0."""
    pid = tl.program_id(0)
    seq = pid // num_kv_heads
    kv_head = pid % num_kv_heads
    start_q, len_q, span_q, start_kv, len_kv, span_kv = sequence_geometry(
        seq, CU_Q, CU_Q_START, CU_KV, CU_KV_START, dense_span_q, dense_span_kv, varlen
    )
    n0 = tl.program_id(1) * BN
    if n0 >= span_kv:
        return
    diag = tl.where(bottom_right != 0, len_kv - len_q, 0)
    cols = n0 + tl.arange(0, BN)
    if GUARDS:
        ok = cols < len_kv
    else:
        ok = cols < span_kv
    tok_kv = start_kv.to(tl.int64) + cols
    k8, k_scale = _load_fp8_rows(
        K8 + kv_head.to(tl.int64) * stride_k8h, K_SCALE + kv_head.to(tl.int64) * stride_ksh,
        tok_kv, ok, HEAD_DIM, RECIPE_MX,
    )  # fmt: skip
    v_rows = _layout_rows(V, seq, tok_kv, cols, varlen, stride_vb, stride_vs, stride_vh, kv_head)
    v = tl.load(v_rows[:, None] + tl.arange(0, HEAD_DIM)[None, :], mask=ok[:, None], other=0.0)
    k_dq = k8  # read by the leaky emulation only
    if not GUARDS:
        k_dq = _dequantize(k8, k_scale, v.dtype, RECIPE_MX)
    dk = _zeros_like_operand(BN, HEAD_DIM, RECIPE_MX)
    dv = tl.zeros([BN, HEAD_DIM], tl.float32)
    lo, full_lo, full_hi, hi = row_block_ranges(
        n0, len_q, len_kv, diag, window_left, window_right, BM, BN
    )
    geo = (
        seq, start_q, len_q, span_q, len_kv, diag, window_left, window_right, varlen, scores_scale
    )  # fmt: skip
    q_heads = (
        Q8, Q_SCALE, DO, DELTA, LSE2, kv_head * kv_group, kv_group,
        stride_q8h, stride_qsh, stride_lh, stride_dob, stride_dos, stride_doh,
    )  # fmt: skip
    dk, dv = _dkdv_row_blocks(
        dk, dv, k8, k_scale, k_dq, v, cols, lo, full_lo, q_heads, geo,
        HEAD_DIM, RECIPE_MX, BM, True, GUARDS,
    )  # fmt: skip
    dk, dv = _dkdv_row_blocks(
        dk, dv, k8, k_scale, k_dq, v, cols, full_lo, full_hi, q_heads, geo,
        HEAD_DIM, RECIPE_MX, BM, False, GUARDS,
    )  # fmt: skip
    dk, dv = _dkdv_row_blocks(
        dk, dv, k8, k_scale, k_dq, v, cols, full_hi, hi, q_heads, geo,
        HEAD_DIM, RECIPE_MX, BM, True, GUARDS,
    )  # fmt: skip
    keep = cols < span_kv  # padding keys inside the allocation: zeros
    dk_rows = _layout_rows(DK, seq, tok_kv, cols, varlen, stride_gb, stride_gs, stride_gh, kv_head)
    dv_rows = _layout_rows(DV, seq, tok_kv, cols, varlen, stride_gb, stride_gs, stride_gh, kv_head)
    _store_grad(dk, dk_rows, keep, softmax_scale, HEAD_DIM, RECIPE_MX)
    _store_grad(dv, dv_rows, keep, 1.0, HEAD_DIM, False)


# ------------------------------------------------------------------------------- dQ


@triton.jit
def _dq_column_blocks(
    dq, q8, q_scale, q_dq, row_scale, do, lse2, delta, rows, n_lo, n_hi, kv_head, geo,
    HEAD_DIM: tl.constexpr, RECIPE_MX: tl.constexpr, BN: tl.constexpr,
    MASKED: tl.constexpr, GUARDS: tl.constexpr,
):  # fmt: skip
    """dQ of one query block over the key column blocks [n_lo, n_hi) of its sequence.

    kv_head: (K8 and K_SCALE head slices, V, the kv head, V's (batch, token, head) strides);
    geo: (seq, start_kv, len_q, len_kv, span_kv, diag, left, right, varlen, scores_scale)."""
    K8h, KSh, V, kv_head_idx, stride_vb, stride_vs, stride_vh = kv_head
    seq, start_kv, len_q, len_kv, span_kv, diag, left, right, varlen, scores_scale = geo
    dtype = do.dtype
    if GUARDS:
        lim_kv = len_kv
    else:
        lim_kv = span_kv
    for n0 in tl.range(n_lo, n_hi, BN):
        cols = n0 + tl.arange(0, BN)
        ok = cols < lim_kv
        tok = start_kv.to(tl.int64) + cols
        k8, k_scale = _load_fp8_rows(K8h, KSh, tok, ok, HEAD_DIM, RECIPE_MX)
        v_rows = _layout_rows(
            V, seq, tok, cols, varlen, stride_vb, stride_vs, stride_vh, kv_head_idx
        )
        v = tl.load(v_rows[:, None] + tl.arange(0, HEAD_DIM)[None, :], mask=ok[:, None], other=0.0)
        k_dq = _dequantize(k8, k_scale, dtype, RECIPE_MX)
        if GUARDS:
            s = _scores(q8, q_scale, k8, k_scale, row_scale, scores_scale, False, RECIPE_MX)
        else:
            s = _dequantized_scores(q_dq, k_dq, scores_scale, RECIPE_MX)
        vis = visible_pairs(rows, cols, len_q, len_kv, diag, left, right)  # read if MASKED
        p = _probabilities(s, lse2, vis, True, MASKED, GUARDS)  # [BM, BN]
        dp = tl.dot(do, tl.trans(v))
        ds = _mask_ds(p * (dp - delta[:, None]), vis, MASKED, GUARDS)
        dq = _accumulate(dq, ds.to(dtype), k_dq, RECIPE_MX)
    return dq


@triton.jit(do_not_specialize=_RUNTIME_SCALARS)
def backward_dq_kernel(
    Q8, Q_SCALE, K8, K_SCALE, V, DO, DQ, DELTA, LSE2,
    CU_Q, CU_Q_START, CU_KV, CU_KV_START,
    stride_q8h, stride_qsh, stride_k8h, stride_ksh,
    stride_vb, stride_vs, stride_vh, stride_dob, stride_dos, stride_doh,
    stride_gb, stride_gs, stride_gh, stride_lh,
    num_heads, num_kv_heads, kv_group, dense_span_q, dense_span_kv, window_left, window_right,
    varlen, bottom_right, scores_scale, softmax_scale,
    HEAD_DIM: tl.constexpr, RECIPE_MX: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    GUARDS: tl.constexpr,
):  # fmt: skip
    """Grid (num_seqs * num_heads, query blocks of BM rows), the last (causal: heaviest) blocks
    first. dQ of BM rows of one (sequence, head) over the key blocks they see, in order: masked
    blocks, fully visible blocks, masked blocks (masking.column_block_ranges). Arguments as
    backward_dkdv_kernel's; DQ in q's layout (strides b/s/h). Rows past the real length (inside
    the allocation) and rows that see nothing get dQ = 0."""
    pid = tl.program_id(0)
    seq = pid // num_heads
    head = pid % num_heads
    kv_head = head // kv_group
    start_q, len_q, span_q, start_kv, len_kv, span_kv = sequence_geometry(
        seq, CU_Q, CU_Q_START, CU_KV, CU_KV_START, dense_span_q, dense_span_kv, varlen
    )
    m0 = (tl.num_programs(1) - 1 - tl.program_id(1)) * BM
    if m0 >= span_q:
        return
    diag = tl.where(bottom_right != 0, len_kv - len_q, 0)
    rows = m0 + tl.arange(0, BM)
    if GUARDS:
        ok = rows < len_q
    else:
        ok = rows < span_q
    tok_q = start_q.to(tl.int64) + rows
    q8, q_scale = _load_fp8_rows(
        Q8 + head.to(tl.int64) * stride_q8h, Q_SCALE + head.to(tl.int64) * stride_qsh,
        tok_q, ok, HEAD_DIM, RECIPE_MX,
    )  # fmt: skip
    do_rows = _layout_rows(DO, seq, tok_q, rows, varlen, stride_dob, stride_dos, stride_doh, head)
    do = tl.load(do_rows[:, None] + tl.arange(0, HEAD_DIM)[None, :], mask=ok[:, None], other=0.0)
    lse2 = tl.load(LSE2 + head.to(tl.int64) * stride_lh + tok_q, mask=ok, other=float("inf"))
    delta = tl.load(DELTA + head.to(tl.int64) * stride_lh + tok_q, mask=ok, other=0.0)
    q_dq = q8  # read by the leaky emulation only
    if not GUARDS:
        q_dq = _dequantize(q8, q_scale, do.dtype, RECIPE_MX)
    if RECIPE_MX:
        row_scale = q_scale  # unused: MXFP8 scales the scores by scores_scale
    else:
        row_scale = q_scale * scores_scale  # the forward's row scale
    dq = _zeros_like_operand(BM, HEAD_DIM, RECIPE_MX)
    lo, full_lo, full_hi, hi = column_block_ranges(
        m0, len_q, len_kv, diag, window_left, window_right, BM, BN
    )
    kv = (
        K8 + kv_head.to(tl.int64) * stride_k8h, K_SCALE + kv_head.to(tl.int64) * stride_ksh, V,
        kv_head, stride_vb, stride_vs, stride_vh,
    )  # fmt: skip
    geo = (
        seq, start_kv, len_q, len_kv, span_kv, diag, window_left, window_right, varlen,
        scores_scale,
    )  # fmt: skip
    dq = _dq_column_blocks(
        dq, q8, q_scale, q_dq, row_scale, do, lse2, delta, rows, lo, full_lo, kv, geo,
        HEAD_DIM, RECIPE_MX, BN, True, GUARDS,
    )  # fmt: skip
    dq = _dq_column_blocks(
        dq, q8, q_scale, q_dq, row_scale, do, lse2, delta, rows, full_lo, full_hi, kv, geo,
        HEAD_DIM, RECIPE_MX, BN, False, GUARDS,
    )  # fmt: skip
    dq = _dq_column_blocks(
        dq, q8, q_scale, q_dq, row_scale, do, lse2, delta, rows, full_hi, hi, kv, geo,
        HEAD_DIM, RECIPE_MX, BN, True, GUARDS,
    )  # fmt: skip
    dq_rows = _layout_rows(DQ, seq, tok_q, rows, varlen, stride_gb, stride_gs, stride_gh, head)
    _store_grad(dq, dq_rows, rows < span_q, softmax_scale, HEAD_DIM, RECIPE_MX)
