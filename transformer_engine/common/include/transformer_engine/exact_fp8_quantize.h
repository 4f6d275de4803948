/*
 * Mask-exact FP8 quantization of attention inputs: plain C API over the CUDA kernels in
 * transformer_engine/common/fused_attn/exact_fp8_*.cu.
 *
 * The rules are those of Note [Mask-exact FP8 scaling] (exact_fp8/formats.py): Q and K get one
 * scale per (token, head), V one scale per (head, chunk of tokens of one sequence) for current
 * scaling and one E8M0 code per (head, chunk of 32 tokens, channel) for MXFP8, so no scale ever
 * reduces over a token that another sequence owns. docs/quantization_kernels.md has the
 * layouts, the rounding rules and the NaN/Inf behaviour.
 *
 * Every function enqueues its work on `stream` and returns at once. The return value is
 * NVTE_EXACT_FP8_SUCCESS or an error code; nvte_exact_fp8_last_error() then describes the error
 * (per host thread). No C++ exception crosses this interface.
 */
#ifndef TRANSFORMER_ENGINE_EXACT_FP8_QUANTIZE_H_
#define TRANSFORMER_ENGINE_EXACT_FP8_QUANTIZE_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status of an API call. */
typedef enum {
  NVTE_EXACT_FP8_SUCCESS = 0,
  NVTE_EXACT_FP8_INVALID_ARGUMENT = 1, /* a shape, stride, pointer or flag is not supported */
  NVTE_EXACT_FP8_CUDA_ERROR = 2        /* the CUDA runtime refused the launch */
} NVTEExactFP8Status;

/* Element type of the high-precision input. */
typedef enum { NVTE_EXACT_FP8_BFLOAT16 = 0, NVTE_EXACT_FP8_FLOAT16 = 1 } NVTEExactFP8DType;

/*
 * A [batch, seqlen, heads, head_dim] view of Q, K or V in device memory. Token t = b * seqlen + s
 * (bshd and sbhd both flatten to (b, s) order); thd is batch = 1, seqlen = total tokens.
 * Strides count elements; head_dim has stride 1. Any other strides work (the packed layouts'
 * views, e.g. q = qkv[:, :, 0] of bs3hd); 16-byte vector loads are used when `data` is 16-byte
 * aligned and every stride is a multiple of 8 elements, element loads otherwise.
 */
typedef struct {
  const void *data;
  NVTEExactFP8DType dtype;
  int64_t batch;
  int64_t seqlen;
  int64_t heads;
  int64_t head_dim;
  int64_t stride_batch;
  int64_t stride_seq;
  int64_t stride_head;
} NVTEExactFP8TokenView;

/*
 * The sequences along the token axis that V chunks must not cross, and the chunk size.
 *
 * cu_seqlens == NULL (bshd, sbhd): every sample of the view is one sequence of seqlen tokens;
 *   num_seqs == batch, num_chunks == batch * ceil(seqlen / chunk); cu_chunks may be NULL.
 * cu_seqlens != NULL (thd, the view's batch == 1): device int32 arrays of num_seqs + 1 entries.
 *   cu_seqlens: token offsets of the sequences (TE's cu_seqlens_padded when the sequences are
 *   padded), cu_seqlens[0] == 0, non-decreasing, cu_seqlens[num_seqs] <= seqlen; tokens past
 *   cu_seqlens[num_seqs] belong to no sequence.
 *   cu_chunks: chunk offsets, cu_chunks[0] == 0 and cu_chunks[n + 1] - cu_chunks[n] ==
 *   ceil((cu_seqlens[n + 1] - cu_seqlens[n]) / chunk); num_chunks >= cu_chunks[num_seqs] (the
 *   count itself, or a bound that needs no read-back: the scales' rows from cu_chunks[num_seqs]
 *   on are left unwritten). The device arrays are not read back by the host: the caller
 *   guarantees these relations.
 * Chunk c of sequence n holds its tokens [c * chunk, min((c + 1) * chunk, length)).
 *
 * columns (transposed outputs only): NULL, and token i goes to column i of data_t; or device
 *   int32 [num_seqs + 1], the aligned layout: columns[0] == 0 and columns[n + 1] == columns[n] +
 *   (length of sequence n, rounded up to a multiple of 32), with columns[num_seqs] <=
 *   data_t_stride. Sequence n's token j then goes to column columns[n] + j, so that every
 *   sequence starts on a 32-byte boundary (a DRAM sector: the casts then write whole sectors);
 *   the columns after each sequence up to the next multiple of 32, and those from
 *   columns[num_seqs] on, are set to 0.
 *
 * key_order (current-scaling transposed output only; MXFP8 takes NVTE_EXACT_FP8_KEYS_NATURAL):
 *   NVTE_EXACT_FP8_KEYS_NATURAL puts a sequence's token j in its column j (as above);
 *   NVTE_EXACT_FP8_KEYS_SM90_PV permutes the tokens inside every complete group of 16 (tokens
 *   16 g .. 16 g + 15 of a sequence, all real): the group's column 16 g + i holds its token
 *   16 g + (0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15)[i], the order in which the sm90
 *   attention kernel's threads hold P's keys (docs/attention_kernel_sm90.md, "P in registers").
 *   An incomplete last group stays in natural order. Same bytes, other columns.
 */
typedef enum {
  NVTE_EXACT_FP8_KEYS_NATURAL = 0,
  NVTE_EXACT_FP8_KEYS_SM90_PV = 1
} NVTEExactFP8KeyOrder;

typedef struct {
  const int32_t *cu_seqlens;
  const int32_t *cu_chunks;
  int64_t num_seqs;
  int64_t num_chunks;
  int32_t chunk;
  const int32_t *columns;
  int32_t key_order; /* NVTEExactFP8KeyOrder */
} NVTEExactFP8Chunks;

/*
 * E4M3 with one current scale per (token, head): amax over head_dim (NaN ignored).
 * x: head_dim in {64, 128, 256}.
 * data:      [heads, tokens, head_dim] E4M3 bytes, 16-byte aligned.
 * scale_inv: [heads, tokens] fp32, 1 / scale.
 */
NVTEExactFP8Status nvte_exact_fp8_per_token_cast(const NVTEExactFP8TokenView *x,
                                                 int use_power_2_scales, float amax_epsilon,
                                                 void *data, float *scale_inv,
                                                 cudaStream_t stream);

/*
 * nvte_exact_fp8_per_token_cast of a and of b in one kernel launch (attention's Q and K: the
 * host time of small calls). a and b: the same dtype, head_dim and batch (their seqlen and heads
 * may differ); each with its own outputs, as nvte_exact_fp8_per_token_cast takes them.
 */
NVTEExactFP8Status nvte_exact_fp8_per_token_cast_pair(const NVTEExactFP8TokenView *a, void *data_a,
                                                      float *scale_inv_a,
                                                      const NVTEExactFP8TokenView *b, void *data_b,
                                                      float *scale_inv_b, int use_power_2_scales,
                                                      float amax_epsilon, cudaStream_t stream);

/*
 * MXFP8 along head_dim: one E8M0 code per 32 consecutive channels of a (token, head).
 * x: head_dim a multiple of 32, at most 1024.
 * data:   [heads, tokens, head_dim] E4M3 bytes, 16-byte aligned.
 * scales: [heads, tokens, head_dim / 32] E8M0 codes.
 */
NVTEExactFP8Status nvte_exact_fp8_per_block_cast_mxfp8_rowwise(const NVTEExactFP8TokenView *x,
                                                               void *data, uint8_t *scales,
                                                               cudaStream_t stream);

/*
 * E4M3 with one current scale per (head, chunk): amax over the chunk's tokens and all head_dim
 * channels, written transposed (token axis last) for the attention kernel's P.V product.
 * v: head_dim in {64, 128, 256}; chunks->chunk in {16, 32, 64, 128}.
 * data_t:    [heads, head_dim, data_t_stride] E4M3 bytes, 16-byte aligned; data_t_stride is a
 *            multiple of 16, and at least batch * seqlen when chunks->columns is NULL (token i
 *            in column i). Columns of no sequence are set to 0.
 * scale_inv: [heads, num_chunks] fp32, 1 / scale.
 */
NVTEExactFP8Status nvte_exact_fp8_per_chunk_cast_transposed(
    const NVTEExactFP8TokenView *v, const NVTEExactFP8Chunks *chunks, int use_power_2_scales,
    float amax_epsilon, void *data_t, int64_t data_t_stride, float *scale_inv,
    cudaStream_t stream);

/*
 * MXFP8 along the tokens: one E8M0 code per (head, chunk of 32 tokens, channel), transposed.
 * v: head_dim a multiple of 32, at most 1024; chunks->chunk == 32.
 * data_t: as for nvte_exact_fp8_per_chunk_cast_transposed.
 * scales: [heads, num_chunks, head_dim] E8M0 codes.
 */
NVTEExactFP8Status nvte_exact_fp8_per_chunk_cast_mxfp8_columnwise_transposed(
    const NVTEExactFP8TokenView *v, const NVTEExactFP8Chunks *chunks, void *data_t,
    int64_t data_t_stride, uint8_t *scales, cudaStream_t stream);

/*
 * The offsets NVTEExactFP8Chunks takes for a thd pack, computed on the device (nothing is read
 * back to the host): from cu_seqlens [num_seqs + 1] (non-decreasing, as NVTEExactFP8Chunks
 * requires), cu_chunks[n] = the sum over m < n of ceil(len_m / chunk) and, when columns is not
 * NULL, columns[n] = the sum over m < n of len_m rounded up to a multiple of 32 (the aligned
 * layout), len_m = cu_seqlens[m + 1] - cu_seqlens[m]. cu_chunks, columns: device int32
 * [num_seqs + 1]. chunk in {16, 32, 64, 128}.
 */
NVTEExactFP8Status nvte_exact_fp8_sequence_offsets(const int32_t *cu_seqlens, int64_t num_seqs,
                                                   int32_t chunk, int32_t *cu_chunks,
                                                   int32_t *columns, cudaStream_t stream);

/* Message of the last failed call on this host thread ("" if none failed). */
const char *nvte_exact_fp8_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_EXACT_FP8_QUANTIZE_H_ */
