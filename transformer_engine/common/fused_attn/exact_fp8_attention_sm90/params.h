/*
 * Parameters of one launch of the sm90 mask-exact FP8 attention forward, in one struct.
 * The TMA descriptors travel in the kernel's own Params of kernel.h; this struct holds what the
 * threads read with ordinary loads. Shapes: see exact_fp8_attention_sm90.h.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_PARAMS_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_PARAMS_H_

#include <stdint.h>

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

struct AttentionParams {
  const float *q_scale;      // [h, t_q] fp32, scale_inv of one (token, head) of Q
  const float *k_scale;      // [h_kv, t_kv] fp32, scale_inv of one (token, kv-head) of K
  const float *v_scale;      // [h_kv, num_chunks] fp32, scale_inv of one 128-token V chunk
  const int32_t *cu_chunks;  // [b + 1] int32, sample n's first V chunk (column of v_scale)
  const int32_t *cu_vt;      // [b + 1] int32, V8^T column of sample n's first key
  void *out;                 // [b, s_q, h, d] bf16 or fp16, strides below (heads d apart)
  float *lse;                // [h, t_q] fp32, natural log; -inf where a row sees nothing
  int batch;
  int seqlen_q;
  int seqlen_kv;
  int heads;
  int heads_kv;
  int num_chunks;
  int64_t out_stride_batch;  // elements between samples of out
  int64_t out_stride_seq;    // elements between tokens of out
  int num_q_tiles;  // ceil(s_q / kQTile)
  bool causal;      // causal (row i sees keys j <= i + causal_offset) or no mask
  int causal_offset;  // 0: top-left; s_kv - s_q: bottom-right (causal_bottom_right)
  float scale_log2;  // softmax_scale * log2(e)
};

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_PARAMS_H_
