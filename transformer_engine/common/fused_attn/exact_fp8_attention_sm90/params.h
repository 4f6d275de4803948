/*
 * Parameters of one launch of the sm90 mask-exact FP8 attention forward, in one struct.
 * The TMA descriptors travel in the kernel's own Params of kernel.h; this struct holds what the
 * threads read with ordinary loads. Shapes: see exact_fp8_attention_sm90.h.
 *
 * Sequences and masks (masks.py, as the Triton kernel reads them): the launch runs `batch`
 * sequences, dense samples (bshd views, seqlen_q / seqlen_kv tokens apart) or thd sequences
 * (from token start_q[n] / start_kv[n]). Sequence n has len_q and len_kv real tokens (cu_q,
 * cu_kv; all of them without a padding mask), and row i < len_q sees key j iff j < len_kv and
 *   i + diag - window_left <= j <= i + diag + window_right,
 * diag = len_kv - len_q when bottom_right, else 0; kUnbounded for a side without a bound.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_PARAMS_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_PARAMS_H_

#include <stdint.h>

#include <cutlass/cutlass.h>

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

constexpr int kUnbounded = 1 << 30;  // a window side without a bound (TE's -1; masking.UNBOUNDED)

struct AttentionParams {
  const float *q_scale;      // [h, tokens_q] fp32, scale_inv of one (token, head) of Q
  const float *k_scale;      // [h_kv, tokens_kv] fp32, scale_inv of one (token, kv-head) of K
  const float *v_scale;      // [h_kv, num_chunks] fp32, scale_inv of one 128-token V chunk
  const int32_t *cu_chunks;  // [b + 1] int32, sequence n's first V chunk (column of v_scale)
  const int32_t *cu_vt;      // [b + 1] int32, V8^T column of sequence n's first key
  const int32_t *cu_q;       // [b + 1] int32, cumulative real query lengths; null: seqlen_q each
  const int32_t *cu_kv;      // [b + 1] int32, cumulative real key lengths; null: seqlen_kv each
  const int32_t *start_q;    // [b + 1] int32 (thd): sequence n's first query token; null: dense
  const int32_t *start_kv;   // [b + 1] int32 (thd): sequence n's first key token; null: dense
  void *out;                 // [b, s_q, h, d] or [tokens_q, h, d]: bf16 or fp16, strides below
  float *lse;                // [h, tokens_q] fp32, natural log; -inf where a row sees nothing
  int batch;                 // sequences
  int seqlen_q;   // dense: tokens per sample; thd: rows per sequence the grid covers (>= len_q)
  int seqlen_kv;  // dense: tokens per sample; thd: 0
  int tokens_q;   // rows of Q8, q_scale and the LSE: b * seqlen_q (dense), the pack's (thd)
  int tokens_kv;  // rows of K8 and k_scale
  int heads;
  int heads_kv;
  int num_chunks;
  int64_t out_stride_batch;  // elements between samples of out (thd: 0)
  int64_t out_stride_seq;    // elements between tokens of out
  int num_q_tiles;     // the grid's query tiles per sequence: ceil(seqlen_q / kQTile)
  int window_left;     // kUnbounded or >= 0
  int window_right;    // kUnbounded or >= 0 (0 for the causal masks)
  bool bottom_right;   // diag = len_kv - len_q (else 0)
  bool zero_v_tail;    // keys past len_kv in a loaded V tile are other tokens' (padding, thd)
  float scale_log2;    // softmax_scale * log2(e)
};

// Where sequence n lives and what its rows see (the Triton kernel's sequence_geometry).
struct Sequence {
  int len_q;    // real queries
  int len_kv;   // real keys
  int span_q;   // rows of its allocation: rows in [len_q, span_q) are written 0 and LSE -inf
  int tok_q;    // token of its first query in Q8, q_scale, the LSE (and out, thd)
  int tok_kv;   // token of its first key in K8, k_scale (and V, thd)
  int diag;     // column of row 0's diagonal
  int v_row0;   // V's coordinates of its first key in the tensor map: (row, sample)
  int v_batch;
  int64_t out0;  // element offset of its first row in out

  CUTLASS_HOST_DEVICE static Sequence load(AttentionParams const &p, int n) {
    Sequence s;
    s.len_q = p.cu_q ? p.cu_q[n + 1] - p.cu_q[n] : p.seqlen_q;
    s.len_kv = p.cu_kv ? p.cu_kv[n + 1] - p.cu_kv[n] : p.seqlen_kv;
    if (p.start_q) {  // thd
      s.tok_q = p.start_q[n];
      s.span_q = p.start_q[n + 1] - s.tok_q;
      s.tok_kv = p.start_kv[n];
      s.v_row0 = s.tok_kv;
      s.v_batch = 0;
      s.out0 = static_cast<int64_t>(s.tok_q) * p.out_stride_seq;
    } else {
      s.tok_q = n * p.seqlen_q;
      s.span_q = p.seqlen_q;
      s.tok_kv = n * p.seqlen_kv;
      s.v_row0 = 0;
      s.v_batch = n;
      s.out0 = n * p.out_stride_batch;
    }
    s.diag = p.bottom_right ? s.len_kv - s.len_q : 0;
    return s;
  }
};

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_PARAMS_H_
