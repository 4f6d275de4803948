/*
 * What the two binding files of `transformer_engine_exact_fp8` (exact_fp8_binding.cpp,
 * exact_fp8_attention_binding.cpp) share: a token view from Python ints, and a C API status
 * turned into a Python exception.
 */
#ifndef TRANSFORMER_ENGINE_PYTORCH_CSRC_EXACT_FP8_BINDING_UTIL_H_
#define TRANSFORMER_ENGINE_PYTORCH_CSRC_EXACT_FP8_BINDING_UTIL_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "transformer_engine/exact_fp8_quantize.h"

namespace exact_fp8_binding {

/* A [batch, seqlen, heads, head_dim] device view (element strides; head_dim contiguous). */
inline NVTEExactFP8TokenView token_view(uintptr_t data, int dtype, int64_t batch, int64_t seqlen,
                                        int64_t heads, int64_t head_dim, int64_t stride_batch,
                                        int64_t stride_seq, int64_t stride_head) {
  return NVTEExactFP8TokenView{reinterpret_cast<const void *>(data),
                               static_cast<NVTEExactFP8DType>(dtype),
                               batch,
                               seqlen,
                               heads,
                               head_dim,
                               stride_batch,
                               stride_seq,
                               stride_head};
}

/* Nothing for NVTE_EXACT_FP8_SUCCESS; else ValueError (invalid argument) or RuntimeError (CUDA
 * error) with the API's message (last_error: the API's function for it). */
inline void raise_on_failure(NVTEExactFP8Status status, const char *(*last_error)()) {
  if (status == NVTE_EXACT_FP8_SUCCESS) return;
  const std::string message = last_error();
  if (status == NVTE_EXACT_FP8_INVALID_ARGUMENT) throw pybind11::value_error(message);
  throw std::runtime_error(message);
}

}  // namespace exact_fp8_binding

#endif  // TRANSFORMER_ENGINE_PYTORCH_CSRC_EXACT_FP8_BINDING_UTIL_H_
