"""Mask-exact FP8 attention forward for Hopper (sm90) in Gluon. The launcher is attention.py.

The same computation as attention_kernel.py (the Triton kernel), step for step and with the same
block sizes, for its most used configuration: current scaling, Q quantized in the kernel, 64
query rows per program. Every per-row operation (the scores' column scale, the online softmax,
the P cast, the V scale, the final division) is the Triton kernel's, in the same order, so the
two kernels give the same output bits (tests/pytorch/attention/test_exact_fp8_attention.py
compares them); see attention_kernel.py for the math and Note [Mask-exact FP8 scaling] in
formats.py for why it keeps every output row independent of what its mask hides. This file only
changes the schedule, which Triton 3.6 does not let one write for sm90:

- Q is quantized once into shared memory, the A operand of every Q.K^T wgmma.
- The FP8 tiles' K8, V8^T and V scales arrive by TMA, their K scales by cp.async, in a ring of
  FP8_STAGES buffers with one mbarrier each, loaded FP8_STAGES tiles ahead of the tile being
  computed.
- The scores of FP8 tile j + 1 (an asynchronous wgmma) are computed while the softmax of tile j
  runs (FA3's intra-warpgroup overlap), so the tensor cores and the exp2 units work together.
- The boundary sub-tiles (BOUNDARY_N keys, the unquantized V) run first, one at a time, with
  K8 by TMA, its scales and V by masked pointer loads (keys past the sequence's real length read
  as 0).

One program is one warpgroup (4 warps); two programs share an SM. The launcher runs this kernel
only when asked (it measured 0.97-1.06x the Triton kernel's speed on the H200:
benchmarks/results/attention_forward.md, which also says what is left to try).
"""

import math

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .formats import KV_TILE, P_SCALE, Q_TILE, V_CHUNK_CURRENT
from .kernel_masking import boundary_subtile_ranges, kv_tile_ranges, sequence_geometry, visible
from .kernel_scaling import per_token_cast_to_fp8

__all__ = ["attention_forward_kernel_sm90", "BLOCK_M", "NUM_WARPS", "FP8_STAGES"]

BLOCK_M = 64  # query rows per program: the M of one warpgroup's wgmma
NUM_WARPS = 4
FP8_STAGES = 2  # FP8 tiles in flight; two programs per SM fit in shared memory with 2
LOG2_P_SCALE = gl.constexpr(int(math.log2(P_SCALE)))
LN2 = gl.constexpr(math.log(2.0))
assert KV_TILE == V_CHUNK_CURRENT and Q_TILE % BLOCK_M == 0

_RUNTIME_SCALARS = [
    "stride_qb", "stride_qs", "stride_qh", "k_rows_per_head", "chunks_per_head",
    "stride_vb", "stride_vs", "stride_vh", "stride_ob", "stride_os", "stride_oh", "stride_lh",
    "num_heads", "kv_group", "dense_span_q", "dense_span_kv", "window_left", "window_right",
    "varlen", "bottom_right", "power_2",
]  # fmt: skip


@gluon.jit
def _online_softmax(t, m_i, l_i, row_scale, MASKED: gl.constexpr):
    """One step of attention_kernel._attend_tiles' online softmax on column-scaled scores t.

    t [BM, N] fp32 (-inf where masked); m_i, l_i, row_scale [BM] in t's row layout.
    Returns (p [BM, N] = P_SCALE * softmax numerator, alpha [BM], l_i, m_new).
    """
    m_new = gl.maximum(m_i, gl.max(t, 1) * row_scale)
    if MASKED:  # rows that have seen nothing yet keep m = -inf: exponentiate against 0
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_ref = m_new
    p = gl.exp2(t * row_scale[:, None] - (m_ref - LOG2_P_SCALE)[:, None])
    alpha = gl.exp2(m_i - m_ref)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, alpha, l_i, m_new


@gluon.jit
def _fp8_tile(j, s_cur, acc, l_i, m_i, row_scale, q_smem, ring):
    """FP8 tile j of the program, whose raw scores s_cur [BM, BN] are ready: issues the scores of
    tile j + 1 (an asynchronous wgmma; past the last tile it reads a stale slot and its result is
    dropped), runs tile j's softmax meanwhile, then P8 . V8 with the per-channel V scale as
    attention_kernel._pv_fp8 applies it, and refills tile j's slot with tile j + STAGES.
    Returns (scores of tile j + 1, acc, l_i, m_i)."""
    descs, bufs, bars, k_row0, vt_row0, vt_col0, vs_row0, fp8_lo, n_fp8 = ring
    k_smem, ks_smem, vt_smem, vs_smem = bufs
    STAGES: gl.constexpr = k_smem.type.shape[0]
    s_layout: gl.constexpr = s_cur.type.layout
    o_layout: gl.constexpr = acc.type.layout
    slot = j % STAGES
    nxt = (j + 1) % STAGES
    mbarrier.wait(bars.index(nxt), ((j + 1) // STAGES) & 1, pred=j + 1 < n_fp8)
    s_next = warpgroup_mma(
        q_smem, k_smem.index(nxt).permute((1, 0)), gl.zeros(s_cur.shape, gl.float32, s_layout),
        use_acc=False, is_async=True,
    )  # fmt: skip
    k_scale_inv = ks_smem.index(slot).load(gl.SliceLayout(0, s_layout))
    p, alpha, l_i, m_i = _online_softmax(s_cur * k_scale_inv[None, :], m_i, l_i, row_scale, False)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    # See Note [Mask-exact FP8 scaling]: P's scale is the fixed P_SCALE, in p already.
    p_operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    p8 = gl.convert_layout(p.to(gl.float8e4nv), p_operand)
    pv = warpgroup_mma(
        p8, vt_smem.index(slot).permute((1, 0)), gl.zeros(acc.shape, gl.float32, o_layout),
        use_acc=False, is_async=True,
    )  # fmt: skip
    pv, s_next = warpgroup_mma_wait(0, deps=(pv, s_next))
    v_scale_inv = vs_smem.index(slot).load(gl.SliceLayout(0, o_layout))
    acc = acc + pv * v_scale_inv[None, :]
    gl.thread_barrier()  # every warp is done with the slot before TMA refills it
    _issue_fp8_tile(
        fp8_lo + j + STAGES, slot, j + STAGES < n_fp8, descs, bufs, bars, k_row0, vt_row0,
        vt_col0, vs_row0,
    )  # fmt: skip
    return s_next, acc, l_i, m_i


@gluon.jit
def _issue_fp8_tile(kt, slot, pred, descs, bufs, bars, k_row0, vt_row0, vt_col0, vs_row0):
    """Loads of FP8 tile kt (BN keys from the sequence's first) into ring slot `slot`: TMA for
    K8, V8^T and the V scales, one cp.async per thread for the K scales; each thread's cp.async
    arrival and the TMA bytes complete the slot's mbarrier."""
    K_DESC, K_SCALE, VT_DESC, VS_DESC = descs
    k_smem, ks_smem, vt_smem, vs_smem = bufs
    BN: gl.constexpr = K_DESC.block_type.shape[0]
    HEAD_DIM: gl.constexpr = K_DESC.block_type.shape[1]
    bar = bars.index(slot)
    nbytes: gl.constexpr = (
        K_DESC.block_type.nbytes + VT_DESC.block_type.nbytes + VS_DESC.block_type.nbytes
    )
    col0 = kt * BN
    mbarrier.expect(bar, nbytes, pred=pred)
    # Not TMA: a box must start 16-byte aligned, and a sequence's first key can sit anywhere.
    ks_layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    offs = gl.arange(0, BN, layout=ks_layout)
    ks_ptrs = K_SCALE + (k_row0 + col0).to(gl.int64) + offs
    async_copy.async_copy_global_to_shared(ks_smem.index(slot), ks_ptrs, mask=(offs < BN) & pred)
    async_copy.mbarrier_arrive(bar, increment_count=False)
    tma.async_copy_global_to_shared(K_DESC, [k_row0 + col0, 0], bar, k_smem.index(slot), pred)
    tma.async_copy_global_to_shared(
        VT_DESC, [vt_row0, vt_col0 + col0], bar, vt_smem.index(slot), pred
    )
    # One V chunk per FP8 tile (KV_TILE == V_CHUNK_CURRENT): chunk vs_row0 + kt of this head.
    tma.async_copy_global_to_shared(
        VS_DESC, [(vs_row0 + kt) * HEAD_DIM], bar, vs_smem.index(slot), pred
    )


@gluon.jit
def _boundary_subtiles(
    acc, l_i, m_i, row_scale, sub_lo, sub_hi, phase, q_smem, kb_smem, vb_smem, bar,
    KB_DESC, K_SCALE, v_seq, stride_vs, k_row0, len_kv, window, q_lo,
    BM: gl.constexpr, HEAD_DIM: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """Boundary sub-tiles [sub_lo, sub_hi) (BNB keys each): masked scores, P in V's dtype times
    the unquantized V. acc [BM, D] in the FP8 P.V layout, l_i/m_i/row_scale in the scores' row
    layout (converted here). Returns (acc, l_i, m_i, phase): phase of the next use of bar."""
    BNB: gl.constexpr = KB_DESC.block_type.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BNB, 32]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    p_operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    v_layout: gl.constexpr = gl.BlockedLayout(
        [1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [num_warps, 1], [1, 0]
    )
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    diag, left, right = window
    out_layout: gl.constexpr = acc.type.layout
    stat_layout: gl.constexpr = m_i.type.layout
    m_i = gl.convert_layout(m_i, row_layout)
    l_i = gl.convert_layout(l_i, row_layout)
    row_scale = gl.convert_layout(row_scale, row_layout)
    rows = q_lo + gl.arange(0, BM, layout=row_layout)
    offs_n = gl.arange(0, BNB, layout=gl.SliceLayout(1, v_layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, v_layout))
    offs_c = gl.arange(0, BNB, layout=gl.SliceLayout(0, s_layout))
    for st in range(sub_lo, sub_hi):
        col0 = st * BNB
        mbarrier.expect(bar, KB_DESC.block_type.nbytes)
        tma.async_copy_global_to_shared(KB_DESC, [k_row0 + col0, 0], bar, kb_smem)
        cols = col0 + offs_c
        ks_ptrs = K_SCALE + k_row0.to(gl.int64) + cols
        k_scale_inv = gl.load(ks_ptrs, mask=cols < len_kv, other=0.0)  # [BNB]
        v_ptrs = v_seq + (col0 + offs_n).to(gl.int64)[:, None] * stride_vs + offs_d[None, :]
        v = gl.load(v_ptrs, mask=(col0 + offs_n < len_kv)[:, None], other=0.0)
        mbarrier.wait(bar, phase)
        phase ^= 1
        s = warpgroup_mma(
            q_smem, kb_smem.permute((1, 0)), gl.zeros([BM, BNB], gl.float32, s_layout),
            use_acc=False,
        )  # fmt: skip
        t = s * k_scale_inv[None, :]
        t = gl.where(visible(rows, cols, len_kv, diag, left, right), t, float("-inf"))
        p, alpha, l_i, m_i = _online_softmax(t, m_i, l_i, row_scale, True)
        acc = gl.convert_layout(acc, o_layout)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        vb_smem.store(v)
        fence_async_shared()
        gl.thread_barrier()
        p16 = gl.convert_layout(p.to(v.dtype), p_operand)
        acc = warpgroup_mma(p16, vb_smem, acc)
        acc = gl.convert_layout(acc, out_layout)
        gl.thread_barrier()  # every warp's wgmma has read kb_smem and vb_smem
    m_i = gl.convert_layout(m_i, stat_layout)
    l_i = gl.convert_layout(l_i, stat_layout)
    return acc, l_i, m_i, phase


@gluon.jit(do_not_specialize=_RUNTIME_SCALARS)
def attention_forward_kernel_sm90(
    Q, V, O, LSE, K_SCALE, K_DESC, VT_DESC, VS_DESC, KB_DESC,
    CU_Q, CU_Q_START, CU_KV, CU_KV_START, CU_CHUNKS, CU_VT,
    stride_qb, stride_qs, stride_qh, k_rows_per_head, chunks_per_head,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, stride_lh,
    num_heads, kv_group, dense_span_q, dense_span_kv, window_left, window_right,
    varlen, bottom_right, power_2, scores_scale, amax_epsilon,
    BM: gl.constexpr, QT: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """Grid (num_seqs * num_heads, query blocks of BM rows), the heaviest (last) blocks first.

    Arguments as attention_kernel.attention_forward_kernel's, with K_SCALE [h_kv, t] fp32
    scale_inv (contiguous) and the other FP8 operands as TMA descriptors: K_DESC K8
    [h_kv * t, d] (block [BN, d]), VT_DESC V8^T [h_kv * d, t_pad] (block [d, BN]), VS_DESC V's
    scale_inv [h_kv * n_chunks * d] (block [d]), KB_DESC K8 in boundary sub-tiles (block
    [BNB, d]). k_rows_per_head: t; chunks_per_head: n_chunks.
    """
    BN: gl.constexpr = K_DESC.block_type.shape[0]
    HEAD_DIM: gl.constexpr = K_DESC.block_type.shape[1]
    BNB: gl.constexpr = KB_DESC.block_type.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BN, 32]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 32]
    )
    q_layout: gl.constexpr = gl.BlockedLayout(
        [1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [num_warps, 1], [1, 0]
    )
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    out_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    pid = gl.program_id(0)
    seq = pid // num_heads
    head = pid % num_heads
    kv_head = head // kv_group
    q_lo = (gl.num_programs(1) - 1 - gl.program_id(1)) * BM
    start_q, len_q, span_q, start_kv, len_kv, span_kv = sequence_geometry(
        seq, CU_Q, CU_Q_START, CU_KV, CU_KV_START, dense_span_q, dense_span_kv, varlen
    )
    if q_lo >= span_q:
        return
    diag = gl.where(bottom_right != 0, len_kv - len_q, 0)
    kv_lo, fp8_lo, fp8_hi, kv_hi = kv_tile_ranges(
        q_lo, len_q, len_kv, diag, window_left, window_right, BM, QT, BN
    )
    right_lo, right_hi, left_lo, left_hi = boundary_subtile_ranges(
        q_lo, len_q, len_kv, diag, window_left, window_right, kv_lo, fp8_lo, fp8_hi, kv_hi,
        BM, BN, BNB,
    )  # fmt: skip

    # Shared memory: Q8, the FP8 ring, one boundary sub-tile; mbarriers: ring slots, boundary.
    q_smem = gl.allocate_shared_memory(
        gl.float8e4nv, [BM, HEAD_DIM],
        gl.NVMMASharedLayout.get_default_for([BM, HEAD_DIM], gl.float8e4nv),
    )  # fmt: skip
    k_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, HEAD_DIM], K_DESC.layout)
    ks_smem = gl.allocate_shared_memory(
        gl.float32, [STAGES, BN], gl.SwizzledSharedLayout(1, 1, 1, [0])
    )
    vt_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, HEAD_DIM, BN], VT_DESC.layout)
    vs_smem = gl.allocate_shared_memory(gl.float32, [STAGES, HEAD_DIM], VS_DESC.layout)
    kb_smem = gl.allocate_shared_memory(gl.float8e4nv, [BNB, HEAD_DIM], KB_DESC.layout)
    vb_smem = gl.allocate_shared_memory(
        V.dtype.element_ty, [BNB, HEAD_DIM],
        gl.NVMMASharedLayout.get_default_for([BNB, HEAD_DIM], V.dtype.element_ty),
    )  # fmt: skip
    bars = gl.allocate_shared_memory(gl.int64, [STAGES + 1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):  # the TMA bytes, and each thread's K-scale cp.async
        mbarrier.init(bars.index(i), count=1 + 32 * num_warps)
    mbarrier.init(bars.index(STAGES), count=1)

    # The FP8 tiles' loads go out first: they run under Q's cast and the boundary sub-tiles.
    tok_kv = start_kv.to(gl.int64)
    k_row0 = (kv_head * k_rows_per_head + tok_kv).to(gl.int32)  # row of K8 and of its scales
    vt_row0 = kv_head * HEAD_DIM
    vt_col0 = gl.load(CU_VT + seq)
    vs_row0 = kv_head * chunks_per_head + gl.load(CU_CHUNKS + seq)
    descs = (K_DESC, K_SCALE, VT_DESC, VS_DESC)
    bufs = (k_smem, ks_smem, vt_smem, vs_smem)
    n_fp8 = fp8_hi - fp8_lo
    for i in gl.static_range(STAGES):
        _issue_fp8_tile(
            fp8_lo + i, i, i < n_fp8, descs, bufs, bars, k_row0, vt_row0, vt_col0, vs_row0
        )

    # Q: cast per token (kernel_scaling.per_token_cast_to_fp8), stored as the wgmma A operand.
    rows_q = q_lo + gl.arange(0, BM, layout=gl.SliceLayout(1, q_layout))
    tok_q = start_q.to(gl.int64) + rows_q
    row_q = gl.where(varlen != 0, tok_q, rows_q.to(gl.int64))
    q_off = seq.to(gl.int64) * stride_qb + row_q * stride_qs + head * stride_qh
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, q_layout))
    q_ptrs = Q + q_off[:, None] + offs_d[None, :]
    x = gl.load(q_ptrs, mask=(rows_q < span_q)[:, None], other=0.0).to(gl.float32)
    q8, q_scale_inv = per_token_cast_to_fp8(x, amax_epsilon, power_2)
    q_smem.store(q8)
    fence_async_shared()
    gl.thread_barrier()
    row_scale = gl.convert_layout(q_scale_inv * scores_scale, row_layout)

    acc = gl.zeros([BM, HEAD_DIM], gl.float32, o_layout)
    l_i = gl.zeros([BM], gl.float32, row_layout)
    m_i = gl.full([BM], float("-inf"), gl.float32, row_layout)

    # Boundary sub-tiles: the right boundary (diagonal / sequence end) first, then the left one
    # (sliding window), as attention_kernel.py orders them.
    first_kv = gl.where(varlen != 0, tok_kv, 0)
    v_seq = V + seq.to(gl.int64) * stride_vb + first_kv * stride_vs + kv_head * stride_vh
    window = (diag, window_left, window_right)
    phase = 0
    acc, l_i, m_i, phase = _boundary_subtiles(
        acc, l_i, m_i, row_scale, right_lo, right_hi, phase, q_smem, kb_smem, vb_smem,
        bars.index(STAGES), KB_DESC, K_SCALE, v_seq, stride_vs, k_row0, len_kv,
        window, q_lo, BM, HEAD_DIM, num_warps,
    )  # fmt: skip
    acc, l_i, m_i, phase = _boundary_subtiles(
        acc, l_i, m_i, row_scale, left_lo, left_hi, phase, q_smem, kb_smem, vb_smem,
        bars.index(STAGES), KB_DESC, K_SCALE, v_seq, stride_vs, k_row0, len_kv,
        window, q_lo, BM, HEAD_DIM, num_warps,
    )  # fmt: skip

    # FP8 tiles: see _fp8_tile.
    if n_fp8 > 0:
        mbarrier.wait(bars.index(0), 0)
        s_zero = gl.zeros([BM, BN], gl.float32, s_layout)
        s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False)
        ring = (descs, bufs, bars, k_row0, vt_row0, vt_col0, vs_row0, fp8_lo, n_fp8)
        for j in range(n_fp8):
            s, acc, l_i, m_i = _fp8_tile(j, s, acc, l_i, m_i, row_scale, q_smem, ring)

    for i in gl.static_range(STAGES + 1):
        mbarrier.invalidate(bars.index(i))

    # Rows past the sequence's real length, and rows that see nothing, give 0 and LSE -inf.
    rows = q_lo + gl.arange(0, BM, layout=out_rows)
    l_o = gl.convert_layout(l_i, out_rows)
    m_o = gl.convert_layout(m_i, out_rows)
    seen = (rows < len_q) & (l_o > 0.0)
    out = gl.div_rn(acc, gl.where(seen, l_o, 1.0)[:, None])  # correctly rounded
    out = gl.where(seen[:, None], out, 0.0)
    lse = gl.where(seen, (m_o + gl.log2(l_o) - LOG2_P_SCALE) * LN2, float("-inf"))
    tok_o = start_q.to(gl.int64) + rows
    row_o = gl.where(varlen != 0, tok_o, rows.to(gl.int64))
    o_off = seq.to(gl.int64) * stride_ob + row_o * stride_os + head * stride_oh
    offs_o = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    rows_in = rows < span_q
    gl.store(
        O + o_off[:, None] + offs_o[None, :], out.to(O.dtype.element_ty), mask=rows_in[:, None]
    )
    gl.store(LSE + head.to(gl.int64) * stride_lh + tok_o, lse, mask=rows_in)
