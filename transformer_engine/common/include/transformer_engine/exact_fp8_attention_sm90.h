/*
 * Mask-exact FP8 attention for Hopper (sm_90a): plain C API over the CuTe kernels in
 * transformer_engine/common/fused_attn/exact_fp8_attention_sm90/ (the forward, and the backward
 * of the same subset).
 *
 * What the kernels run (docs/attention_kernel_sm90.md): bshd views (sbhd through their
 * strides), d = 128 (the forward also 64), bf16 or fp16 Q/K/V/O (the `dtype` fields), current
 * scaling (rules v2),
 * causal (top-left) or no mask, MHA and GQA; the forward also thd, padding masks (cu_seqlens),
 * causal bottom-right and sliding windows. The numerics are those of Note [Mask-exact FP8
 * scaling] and Note [V scale in the rescale] (exact_fp8/formats.py). Q, K and V arrive quantized
 * by the fork's quantization kernels (exact_fp8_quantize.h), or unquantized to
 * nvte_exact_fp8_attention_sm90_fwd_quantizing, which runs those casts first.
 *
 * The call enqueues its work on `stream` and returns at once: NVTE_EXACT_FP8_SUCCESS or an
 * error code, described by nvte_exact_fp8_attention_sm90_last_error() (per host thread).
 * No C++ exception crosses this interface.
 */
#ifndef TRANSFORMER_ENGINE_EXACT_FP8_ATTENTION_SM90_H_
#define TRANSFORMER_ENGINE_EXACT_FP8_ATTENTION_SM90_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "transformer_engine/exact_fp8_quantize.h"

#ifdef __cplusplus
extern "C" {
#endif


/*
 * Device arrays of one forward call (all contiguous, row-major as the shapes read). Dense
 * samples (bshd views): t_q = batch * seqlen_q and t_kv = batch * seqlen_kv count tokens in
 * (b, s) order. thd (seq_starts_q and seq_starts_kv given): `batch` sequences packed into
 * t_q = tokens_q and t_kv = tokens_kv tokens, q, k, v and out as [t, heads, d].
 *
 * Masks (exact_fp8/masks.py, TE's names): row i of a sequence with len_q queries and len_kv keys
 * (cu_seqlens_q / cu_seqlens_kv, or all of them) sees key j iff j < len_kv and
 *   i + diag - window_left <= j <= i + diag + window_right  (a side of -1, or no
 *                                                           sliding_window: unbounded),
 * diag = 0 for causal 1 (top-left), len_kv - len_q otherwise (TE's bottom-right alignment);
 * causal 1 and 2 bound the right side at 0. Rows i >= len_q (padding) get O = 0, LSE = -inf.
 */
typedef struct {
  const void *q8;          /* [heads, t_q, d] E4M3, Q per token (per_token_cast_to_fp8)       */
  const float *q_scale;    /* [heads, t_q] fp32, scale_inv of one (token, head) of Q          */
  const void *k8;          /* [heads_kv, t_kv, d] E4M3                                          */
  const float *k_scale;    /* [heads_kv, t_kv] fp32, scale_inv of one (token, kv-head) of K   */
  const void *v8t;         /* [heads_kv, d, vt_width] E4M3, V transposed (K-major for P.V)     */
  const float *v_scale;    /* [heads_kv, num_chunks] fp32, scale_inv of one 128-token V chunk */
  const int32_t *cu_chunks; /* [batch + 1] int32: sample n's first V chunk                     */
  const int32_t *cu_vt;    /* [batch + 1] int32: V8^T column of sample n's first key (16 | it) */
  const void *v;           /* [batch, seqlen_kv, heads_kv, d] dtype: unquantized V (boundary);
                              strides v_stride_batch, v_stride_seq, d, 1                      */
  void *out;               /* [batch, seqlen_q, heads, d] dtype; strides out_stride_batch,
                              out_stride_seq, d, 1                                            */
  float *lse;              /* [heads, t_q] fp32: natural log, -inf for a row that sees nothing */
  int64_t batch;
  int64_t seqlen_q;
  int64_t seqlen_kv;
  int64_t heads;
  int64_t heads_kv;
  int64_t head_dim;
  int64_t vt_width;   /* columns of V8^T (a multiple of 16) */
  int64_t num_chunks; /* columns of v_scale */
  int32_t causal;     /* 0: no causal bound, 1: causal (top-left: row i sees keys j <= i), 2: causal
                         bottom-right (j <= i + len_kv - len_q) */
  float softmax_scale;
  int32_t fp8_v_everywhere; /* 0: the mask-exact rules. 1: LEAKY, for benchmarks and negative
                               controls only: boundary tiles keep their element-wise mask but
                               use E4M3 P and V8^T with its chunk scale, which hidden keys
                               enter; dense samples without cu_seqlens or window, seqlen_kv a
                               multiple of 128 */
  /* Element strides of v's and out's batch and sequence dims (heads d apart, d contiguous):
     0 for the contiguous bshd layout's; sbhd views pass theirs. Multiples of 8 (TMA). */
  int64_t v_stride_batch;
  int64_t v_stride_seq;
  int64_t out_stride_batch;
  int64_t out_stride_seq;
  int32_t dtype; /* NVTEExactFP8DType of v and out (and of the quantizing forward's q and k):
                    NVTE_EXACT_FP8_BFLOAT16 (0) or NVTE_EXACT_FP8_FLOAT16; the leaky variant
                    is bf16 only */
  /* Sequences: all null for dense samples of seqlen_q / seqlen_kv real tokens each. */
  const int32_t *cu_seqlens_q;  /* [batch + 1] int32: cumulative real query lengths (a padding
                                   mask's, or thd's; with cu_seqlens_kv)                      */
  const int32_t *cu_seqlens_kv; /* [batch + 1] int32: of the keys                              */
  const int32_t *seq_starts_q;  /* thd: [batch + 1] int32, each sequence's first token (TE's
                                   cu_seqlens_q_padded, or cu_seqlens_q); null: dense samples */
  const int32_t *seq_starts_kv; /* thd: of the keys (with seq_starts_q)                       */
  int64_t tokens_q;  /* thd: t_q (then seqlen_q: the rows per sequence the grid covers, at least
                        the longest real length; rows of an allocation past them are written
                        0 / -inf too; out_stride_batch is not read); dense: 0                  */
  int64_t tokens_kv; /* thd: t_kv (then seqlen_kv is not read); dense: 0                       */
  int32_t sliding_window; /* 0: none (a zeroed struct's); 1: window_left / window_right apply */
  int32_t window_left;  /* TE's window_size: -1 unbounded, or >= 0                             */
  int32_t window_right; /* -1 unbounded, or >= 0; causal 1 and 2 take 0 whatever it is         */
} NVTEExactFP8AttentionSm90Args;

/* Whether this library was built with the sm_90a kernel (1) or without it (0). */
int nvte_exact_fp8_attention_sm90_built(void);

/* The forward: out and lse as the Triton kernel returns them (rows that see nothing: 0, -inf).
 * Needs a device of compute capability 9.0. */
NVTEExactFP8Status nvte_exact_fp8_attention_sm90_fwd(const NVTEExactFP8AttentionSm90Args *args,
                                                     cudaStream_t stream);

/*
 * One forward from the high-precision inputs, for the host time of small calls: the casts of
 * exact_fp8_quantize.h (Q and K per token, V per chunk into V8^T in the kernel's key order
 * NVTE_EXACT_FP8_KEYS_SM90_PV) and the attention of nvte_exact_fp8_attention_sm90_fwd, enqueued
 * on one stream by one call. Same numerics and outputs as those four calls.
 */
typedef struct {
  NVTEExactFP8TokenView q; /* [batch, seqlen_q, heads, d] attention.dtype, any strides (d
                              contiguous)                                                    */
  NVTEExactFP8TokenView k; /* [batch, seqlen_kv, heads_kv, d] attention.dtype, any strides   */
  int32_t use_power_2_scales;
  float amax_epsilon;
  /* q8, q_scale, k8, k_scale, v8t, v_scale: the casts' outputs (the caller's buffers, of the
   * shapes above); v: the contiguous V that the V cast reads and the boundary tiles use;
   * cu_chunks: n * ceil(seqlen_kv / 128); cu_vt: n * seqlen_kv, or n times seqlen_kv rounded
   * up to 32 when batch > 1 and seqlen_kv % 16 != 0 (the aligned layout, whose columns the V
   * cast then writes). vt_width, num_chunks: of those layouts. Dense samples only: the
   * sequence fields are null (a padding mask or thd runs the casts, then the forward). */
  NVTEExactFP8AttentionSm90Args attention;
} NVTEExactFP8AttentionSm90QuantizingArgs;

/* The forward of NVTEExactFP8AttentionSm90QuantizingArgs: out and lse as
 * nvte_exact_fp8_attention_sm90_fwd writes them. An argument error enqueues nothing. The V cast
 * runs on a second stream of the calling host thread (made on its first call outside stream
 * capture; without one, on `stream`), forked from `stream` and joined back into it before the
 * attention kernel: what follows on `stream` sees every cast done. */
NVTEExactFP8Status nvte_exact_fp8_attention_sm90_fwd_quantizing(
    const NVTEExactFP8AttentionSm90QuantizingArgs *args, cudaStream_t stream);

/*
 * Device arrays of one backward call (docs/backward.md, "The sm90 CUDA backward"): the
 * gradients of the forward of nvte_exact_fp8_attention_sm90_fwd, from the forward's own FP8
 * operands (Q8, K8 and their scales, bit for bit: the caller quantizes Q and K again with the
 * same casts) and its LSE. rows_pad = seqlen_q and keys_pad = seqlen_kv rounded up to 128.
 */
typedef struct {
  const void *q8;           /* [heads, t_q, d] E4M3, Q per token                               */
  const void *q_dq;         /* [heads, t_q, d] dtype: Q8 * scale_inv, saturated to its range    */
  const void *k8;           /* [heads_kv, t_kv, d] E4M3                                         */
  const void *k_dq;         /* [heads_kv, t_kv, d] dtype: K8 * scale_inv, saturated             */
  const float *k_scale;     /* [heads_kv, batch, keys_pad] fp32: K8's scale_inv, 0 past seqlen_kv */
  const void *v;            /* [batch, seqlen_kv, heads_kv, d] dtype                            */
  const void *d_out;        /* [batch, seqlen_q, heads, d] dtype                                */
  const float *row_values;  /* [3, heads, batch, rows_pad] fp32: per row q_scale_inv *
                               softmax_scale * log2(e), the forward's LSE * log2(e) (+inf for a
                               row that sees nothing) and D = sum of dO * O over dO != 0;
                               (1, +inf, 0) past seqlen_q */
  void *dq;                 /* [batch, seqlen_q, heads, d] dtype                                */
  void *dk;                 /* [batch, seqlen_kv, heads_kv, d] dtype                            */
  void *dv;                 /* [batch, seqlen_kv, heads_kv, d] dtype                            */
  int64_t batch;
  int64_t seqlen_q;
  int64_t seqlen_kv;
  int64_t heads;
  int64_t heads_kv;
  int64_t head_dim;
  int32_t causal; /* 1: causal (top-left), 0: no mask */
  float softmax_scale;
  /* Element strides of the batch and sequence dims of v, d_out, dq and of dk and dv (heads d
     apart, d contiguous): 0 for the contiguous bshd layout's; sbhd views pass theirs.
     Multiples of 8 (TMA). */
  int64_t v_stride_batch;
  int64_t v_stride_seq;
  int64_t d_out_stride_batch;
  int64_t d_out_stride_seq;
  int64_t dq_stride_batch;
  int64_t dq_stride_seq;
  int64_t dkv_stride_batch;
  int64_t dkv_stride_seq;
  /* Scratch, any contents on entry; with row_blocks = ceil(seqlen_q / 64): */
  float *dq_accum;   /* [heads, batch, row_blocks, 64 * 128] fp32: the dQ accumulator          */
  int32_t *dq_count; /* [heads, batch, row_blocks] int32: its counters (zeroed by the call)    */
  int32_t dtype; /* NVTEExactFP8DType of q_dq, k_dq, v, d_out and the gradients: bf16 (0) or fp16;
                    q_dq and k_dq saturated to that dtype's range */
} NVTEExactFP8AttentionSm90BwdArgs;

/* The backward: dq, dk, dv (every element written; deterministic: every sum in an order fixed
 * by the shape, the key tiles' dQ contributions ordered by counters). On `stream`: a zeroing of
 * dq_count, the backward kernel (dK, dV, the dQ accumulator), the dQ store. Needs a device of
 * compute capability 9.0. */
NVTEExactFP8Status nvte_exact_fp8_attention_sm90_bwd(const NVTEExactFP8AttentionSm90BwdArgs *args,
                                                     cudaStream_t stream);

/* The message of the last failed call of this thread. */
const char *nvte_exact_fp8_attention_sm90_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_EXACT_FP8_ATTENTION_SM90_H_ */
