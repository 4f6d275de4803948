/*
 * C API of the mask-exact FP8 quantizers (transformer_engine/exact_fp8_quantize.h): argument
 * validation, error reporting, dispatch to the kernels of exact_fp8_rowwise.cu,
 * exact_fp8_transposed_current.cu, exact_fp8_transposed.cu and exact_fp8_offsets.cu.
 */
#include <stdint.h>

#include <exception>
#include <string>

#include "exact_fp8_kernels.h"
#include "exact_fp8_numerics.cuh"
#include "transformer_engine/exact_fp8_quantize.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace {

constexpr int64_t kMaxGridYZ = 65535;
constexpr int64_t kMaxInt32 = 2147483647;
constexpr int64_t kMaxMxHeadDim = 1024;
constexpr int64_t kOutputAlignment = 16;

thread_local std::string last_error;

NVTEExactFP8Status fail(NVTEExactFP8Status status, const char *function, const std::string &msg) {
  last_error = std::string(function) + ": " + msg;
  return status;
}

std::string num(int64_t value) { return std::to_string(value); }

/* Each check returns "" when the argument is fine, else what is wrong with it. */
std::string check_view(const NVTEExactFP8TokenView *x) {
  if (x == nullptr) return "the input view is NULL";
  if (x->dtype != NVTE_EXACT_FP8_BFLOAT16 && x->dtype != NVTE_EXACT_FP8_FLOAT16) {
    return "dtype must be NVTE_EXACT_FP8_BFLOAT16 or NVTE_EXACT_FP8_FLOAT16, got " +
           num(x->dtype);
  }
  if (x->batch < 0 || x->seqlen < 0 || x->heads < 1 || x->head_dim < 1) {
    return "batch and seqlen must be >= 0, heads and head_dim >= 1; got batch " + num(x->batch) +
           ", seqlen " + num(x->seqlen) + ", heads " + num(x->heads) + ", head_dim " +
           num(x->head_dim);
  }
  if (x->batch > kMaxGridYZ || x->heads > kMaxGridYZ) {
    return "batch and heads must be at most 65535, got " + num(x->batch) + " and " +
           num(x->heads);
  }
  if (x->seqlen > kMaxInt32 || x->batch * x->seqlen > kMaxInt32) {
    return "batch * seqlen must fit in int32, got " + num(x->batch) + " * " + num(x->seqlen);
  }
  if (x->batch * x->seqlen > 0 && x->data == nullptr) return "the input data pointer is NULL";
  return "";
}

std::string check_current_head_dim(int64_t head_dim) {
  if (head_dim == 64 || head_dim == 128 || head_dim == 256) return "";
  return "current scaling supports head_dim 64, 128 or 256, got " + num(head_dim);
}

std::string check_mx_head_dim(int64_t head_dim) {
  if (head_dim % kMxBlock == 0 && head_dim <= kMaxMxHeadDim) return "";
  return "MXFP8 needs head_dim to be a multiple of 32 and at most 1024, got " + num(head_dim);
}

std::string check_output(const void *ptr, bool needed, const char *name) {
  if (!needed) return "";
  if (ptr == nullptr) return std::string(name) + " is NULL";
  if (reinterpret_cast<uintptr_t>(ptr) % kOutputAlignment != 0) {
    return std::string(name) + " must be 16-byte aligned";
  }
  return "";
}

std::string check_chunks(const NVTEExactFP8TokenView &v, const NVTEExactFP8Chunks *c) {
  if (c == nullptr) return "the chunk description is NULL";
  if (c->chunk != 16 && c->chunk != 32 && c->chunk != 64 && c->chunk != 128) {
    return "chunk must be 16, 32, 64 or 128 tokens, got " + num(c->chunk);
  }
  if (c->key_order != NVTE_EXACT_FP8_KEYS_NATURAL && c->key_order != NVTE_EXACT_FP8_KEYS_SM90_PV) {
    return "key_order must be NVTE_EXACT_FP8_KEYS_NATURAL or NVTE_EXACT_FP8_KEYS_SM90_PV, got " +
           num(c->key_order);
  }
  if (c->cu_seqlens == nullptr) {
    const int64_t expected = v.batch * ((v.seqlen + c->chunk - 1) / c->chunk);
    if (c->num_seqs != v.batch || c->num_chunks != expected) {
      return "without cu_seqlens every sample is one sequence: num_seqs must be " +
             num(v.batch) + " and num_chunks " + num(expected) + ", got " + num(c->num_seqs) +
             " and " + num(c->num_chunks);
    }
    return "";
  }
  if (v.batch != 1) return "with cu_seqlens (thd) the view's batch must be 1, got " + num(v.batch);
  if (c->cu_chunks == nullptr) return "cu_chunks is NULL while cu_seqlens is given";
  const int64_t most = (v.seqlen + c->chunk - 1) / c->chunk + c->num_seqs;
  if (c->num_seqs < 1 || c->num_seqs >= kMaxInt32 || c->num_chunks < 0 || c->num_chunks > most) {
    return "num_seqs must be >= 1 and num_chunks in [0, " + num(most) + "], got " +
           num(c->num_seqs) + " and " + num(c->num_chunks);
  }
  return "";
}

std::string check_transposed_output(const NVTEExactFP8TokenView &v,
                                    const NVTEExactFP8Chunks &c, const void *data_t,
                                    int64_t stride, const void *scales) {
  std::string err = check_output(data_t, stride > 0, "data_t");
  if (err.empty()) err = check_output(scales, c.num_chunks > 0, "scales");
  if (!err.empty()) return err;
  if (stride % 16 != 0) return "data_t_stride must be a multiple of 16, got " + num(stride);
  if (c.columns == nullptr && stride < v.batch * v.seqlen) {
    return "data_t_stride must be at least the token count " + num(v.batch * v.seqlen) +
           " (token i in column i), got " + num(stride);
  }
  return "";
}

NVTEExactFP8Status finish(cudaError_t err, const char *function) {
  if (err == cudaSuccess) return NVTE_EXACT_FP8_SUCCESS;
  return fail(NVTE_EXACT_FP8_CUDA_ERROR, function,
              std::string("CUDA error ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

/* Runs `body` (which returns a status) so that no exception leaves the C API. */
template <typename Body>
NVTEExactFP8Status guarded(const char *function, Body body) {
  try {
    return body();
  } catch (const std::exception &e) {
    return fail(NVTE_EXACT_FP8_CUDA_ERROR, function, e.what());
  } catch (...) {
    return fail(NVTE_EXACT_FP8_CUDA_ERROR, function, "unknown C++ exception");
  }
}

}  // namespace
}  // namespace exact_fp8
}  // namespace transformer_engine

using transformer_engine::exact_fp8::RowRule;
using transformer_engine::exact_fp8::ScaleOptions;
namespace ef = transformer_engine::exact_fp8;

extern "C" {

NVTEExactFP8Status nvte_exact_fp8_per_token_cast(const NVTEExactFP8TokenView *x,
                                                 int use_power_2_scales, float amax_epsilon,
                                                 void *data, float *scale_inv,
                                                 cudaStream_t stream) {
  constexpr const char *kName = "nvte_exact_fp8_per_token_cast";
  return ef::guarded(kName, [&]() {
    std::string err = ef::check_view(x);
    if (err.empty()) err = ef::check_current_head_dim(x->head_dim);
    const bool any = err.empty() && x->batch * x->seqlen > 0;
    if (err.empty()) err = ef::check_output(data, any, "data");
    if (err.empty()) err = ef::check_output(scale_inv, any, "scale_inv");
    if (!err.empty()) return ef::fail(NVTE_EXACT_FP8_INVALID_ARGUMENT, kName, err);
    const ScaleOptions opts{use_power_2_scales != 0, amax_epsilon};
    return ef::finish(ef::launch_rowwise_cast(RowRule::kPerToken, *x, opts,
                                              static_cast<uint8_t *>(data), scale_inv, stream),
                      kName);
  });
}

NVTEExactFP8Status nvte_exact_fp8_per_token_cast_pair(const NVTEExactFP8TokenView *a, void *data_a,
                                                      float *scale_inv_a,
                                                      const NVTEExactFP8TokenView *b, void *data_b,
                                                      float *scale_inv_b, int use_power_2_scales,
                                                      float amax_epsilon, cudaStream_t stream) {
  constexpr const char *kName = "nvte_exact_fp8_per_token_cast_pair";
  return ef::guarded(kName, [&]() {
    std::string err = ef::check_view(a);
    if (err.empty()) err = ef::check_view(b);
    if (err.empty()) err = ef::check_current_head_dim(a->head_dim);
    if (err.empty() && (a->dtype != b->dtype || a->head_dim != b->head_dim ||
                        a->batch != b->batch)) {
      err = "a and b must have the same dtype, head_dim and batch";
    }
    const bool any_a = err.empty() && a->batch * a->seqlen > 0;
    const bool any_b = err.empty() && b->batch * b->seqlen > 0;
    if (err.empty()) err = ef::check_output(data_a, any_a, "data_a");
    if (err.empty()) err = ef::check_output(scale_inv_a, any_a, "scale_inv_a");
    if (err.empty()) err = ef::check_output(data_b, any_b, "data_b");
    if (err.empty()) err = ef::check_output(scale_inv_b, any_b, "scale_inv_b");
    if (!err.empty()) return ef::fail(NVTE_EXACT_FP8_INVALID_ARGUMENT, kName, err);
    const ScaleOptions opts{use_power_2_scales != 0, amax_epsilon};
    return ef::finish(ef::launch_per_token_cast_pair(*a, static_cast<uint8_t *>(data_a),
                                                     scale_inv_a, *b,
                                                     static_cast<uint8_t *>(data_b), scale_inv_b,
                                                     opts, stream),
                      kName);
  });
}

NVTEExactFP8Status nvte_exact_fp8_per_block_cast_mxfp8_rowwise(const NVTEExactFP8TokenView *x,
                                                               void *data, uint8_t *scales,
                                                               cudaStream_t stream) {
  constexpr const char *kName = "nvte_exact_fp8_per_block_cast_mxfp8_rowwise";
  return ef::guarded(kName, [&]() {
    std::string err = ef::check_view(x);
    if (err.empty()) err = ef::check_mx_head_dim(x->head_dim);
    const bool any = err.empty() && x->batch * x->seqlen > 0;
    if (err.empty()) err = ef::check_output(data, any, "data");
    if (err.empty()) err = ef::check_output(scales, any, "scales");
    if (!err.empty()) return ef::fail(NVTE_EXACT_FP8_INVALID_ARGUMENT, kName, err);
    return ef::finish(ef::launch_rowwise_cast(RowRule::kMxfp8, *x, ScaleOptions{false, 0.0f},
                                              static_cast<uint8_t *>(data), scales, stream),
                      kName);
  });
}

NVTEExactFP8Status nvte_exact_fp8_per_chunk_cast_transposed(
    const NVTEExactFP8TokenView *v, const NVTEExactFP8Chunks *chunks, int use_power_2_scales,
    float amax_epsilon, void *data_t, int64_t data_t_stride, float *scale_inv,
    cudaStream_t stream) {
  constexpr const char *kName = "nvte_exact_fp8_per_chunk_cast_transposed";
  return ef::guarded(kName, [&]() {
    std::string err = ef::check_view(v);
    if (err.empty()) err = ef::check_current_head_dim(v->head_dim);
    if (err.empty()) err = ef::check_chunks(*v, chunks);
    if (err.empty()) {
      err = ef::check_transposed_output(*v, *chunks, data_t, data_t_stride, scale_inv);
    }
    if (!err.empty()) return ef::fail(NVTE_EXACT_FP8_INVALID_ARGUMENT, kName, err);
    const ScaleOptions opts{use_power_2_scales != 0, amax_epsilon};
    return ef::finish(ef::launch_current_cast_transposed(*v, *chunks, opts,
                                                         static_cast<uint8_t *>(data_t),
                                                         data_t_stride, scale_inv, stream),
                      kName);
  });
}

NVTEExactFP8Status nvte_exact_fp8_per_chunk_cast_mxfp8_columnwise_transposed(
    const NVTEExactFP8TokenView *v, const NVTEExactFP8Chunks *chunks, void *data_t,
    int64_t data_t_stride, uint8_t *scales, cudaStream_t stream) {
  constexpr const char *kName = "nvte_exact_fp8_per_chunk_cast_mxfp8_columnwise_transposed";
  return ef::guarded(kName, [&]() {
    std::string err = ef::check_view(v);
    if (err.empty()) err = ef::check_mx_head_dim(v->head_dim);
    if (err.empty()) err = ef::check_chunks(*v, chunks);
    if (err.empty() && chunks->chunk != ef::kMxBlock) {
      err = "MXFP8 chunks are 32 tokens (one E8M0 block), got " + ef::num(chunks->chunk);
    }
    if (err.empty() && chunks->key_order != NVTE_EXACT_FP8_KEYS_NATURAL) {
      err = "the MXFP8 transposed cast writes NVTE_EXACT_FP8_KEYS_NATURAL order only";
    }
    if (err.empty()) {
      err = ef::check_transposed_output(*v, *chunks, data_t, data_t_stride, scales);
    }
    if (!err.empty()) return ef::fail(NVTE_EXACT_FP8_INVALID_ARGUMENT, kName, err);
    return ef::finish(ef::launch_mxfp8_cast_transposed(*v, *chunks, static_cast<uint8_t *>(data_t),
                                                       data_t_stride, scales, stream),
                      kName);
  });
}

NVTEExactFP8Status nvte_exact_fp8_sequence_offsets(const int32_t *cu_seqlens, int64_t num_seqs,
                                                   int32_t chunk, int32_t *cu_chunks,
                                                   int32_t *columns, cudaStream_t stream) {
  constexpr const char *kName = "nvte_exact_fp8_sequence_offsets";
  return ef::guarded(kName, [&]() {
    std::string err;
    if (cu_seqlens == nullptr || cu_chunks == nullptr) err = "cu_seqlens or cu_chunks is NULL";
    if (err.empty() && (num_seqs < 1 || num_seqs >= ef::kMaxInt32)) {
      err = "num_seqs must be in [1, 2^31 - 1), got " + ef::num(num_seqs);
    }
    if (err.empty() && chunk != 16 && chunk != 32 && chunk != 64 && chunk != 128) {
      err = "chunk must be 16, 32, 64 or 128 tokens, got " + ef::num(chunk);
    }
    if (!err.empty()) return ef::fail(NVTE_EXACT_FP8_INVALID_ARGUMENT, kName, err);
    return ef::finish(ef::launch_sequence_offsets(cu_seqlens, static_cast<int>(num_seqs), chunk,
                                                  cu_chunks, columns, stream),
                      kName);
  });
}

const char *nvte_exact_fp8_last_error(void) { return ef::last_error.c_str(); }

}  // extern "C"
