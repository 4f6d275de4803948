/*
 * Python module `transformer_engine_exact_fp8`: the C API of exact_fp8_quantize.h for Python.
 *
 * Tensors travel as device pointers (Python ints) with their shapes and element strides, and the
 * CUDA stream as an int, so the module needs no libtorch. A failed call raises ValueError
 * (invalid argument) or RuntimeError (CUDA error) with the C API's message.
 */
#include <pybind11/pybind11.h>

#include <cstdint>

#include "exact_fp8_binding_util.h"
#include "transformer_engine/exact_fp8_quantize.h"

namespace py = pybind11;

// exact_fp8_attention_binding.cpp: the attention kernels' functions.
void register_exact_fp8_attention(py::module_ &m);

namespace {

template <typename T>
T *as_ptr(uintptr_t address) {
  return reinterpret_cast<T *>(address);
}

cudaStream_t as_stream(uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

void check(NVTEExactFP8Status status) {
  exact_fp8_binding::raise_on_failure(status, nvte_exact_fp8_last_error);
}

NVTEExactFP8Chunks chunks(uintptr_t cu_seqlens, uintptr_t cu_chunks, int64_t num_seqs,
                          int64_t num_chunks, int32_t chunk, uintptr_t columns,
                          int32_t key_order) {
  return NVTEExactFP8Chunks{as_ptr<const int32_t>(cu_seqlens),
                            as_ptr<const int32_t>(cu_chunks),
                            num_seqs,
                            num_chunks,
                            chunk,
                            as_ptr<const int32_t>(columns),
                            key_order};
}

}  // namespace

PYBIND11_MODULE(transformer_engine_exact_fp8, m) {
  m.doc() = "Mask-exact FP8 quantization kernels (see docs/quantization_kernels.md).";
  m.attr("BFLOAT16") = static_cast<int>(NVTE_EXACT_FP8_BFLOAT16);
  m.attr("FLOAT16") = static_cast<int>(NVTE_EXACT_FP8_FLOAT16);

  py::class_<NVTEExactFP8TokenView>(m, "TokenView",
                                    "A [batch, seqlen, heads, head_dim] device view (element "
                                    "strides; head_dim contiguous).")
      .def(py::init(&exact_fp8_binding::token_view), py::arg("data"), py::arg("dtype"), py::arg("batch"),
           py::arg("seqlen"), py::arg("heads"), py::arg("head_dim"), py::arg("stride_batch"),
           py::arg("stride_seq"), py::arg("stride_head"));

  py::class_<NVTEExactFP8Chunks>(m, "Chunks",
                                 "Sequences and chunk size of a per-chunk cast (cu_seqlens 0: "
                                 "one sequence per sample; columns 0: token i in column i; "
                                 "key_order: NVTEExactFP8KeyOrder).")
      .def(py::init(&chunks), py::arg("cu_seqlens"), py::arg("cu_chunks"), py::arg("num_seqs"),
           py::arg("num_chunks"), py::arg("chunk"), py::arg("columns") = 0,
           py::arg("key_order") = static_cast<int32_t>(NVTE_EXACT_FP8_KEYS_NATURAL));
  m.attr("KEYS_NATURAL") = static_cast<int>(NVTE_EXACT_FP8_KEYS_NATURAL);
  m.attr("KEYS_SM90_PV") = static_cast<int>(NVTE_EXACT_FP8_KEYS_SM90_PV);

  m.def(
      "per_token_cast",
      [](const NVTEExactFP8TokenView &x, bool use_power_2_scales, float amax_epsilon,
         uintptr_t data, uintptr_t scale_inv, uintptr_t stream) {
        check(nvte_exact_fp8_per_token_cast(&x, use_power_2_scales, amax_epsilon,
                                            as_ptr<void>(data), as_ptr<float>(scale_inv),
                                            as_stream(stream)));
      },
      py::arg("x"), py::arg("use_power_2_scales"), py::arg("amax_epsilon"), py::arg("data"),
      py::arg("scale_inv"), py::arg("stream"),
      "E4M3 with one scale per (token, head): data [h, t, d], scale_inv [h, t].");

  m.def(
      "per_block_cast_mxfp8_rowwise",
      [](const NVTEExactFP8TokenView &x, uintptr_t data, uintptr_t scales, uintptr_t stream) {
        check(nvte_exact_fp8_per_block_cast_mxfp8_rowwise(
            &x, as_ptr<void>(data), as_ptr<uint8_t>(scales), as_stream(stream)));
      },
      py::arg("x"), py::arg("data"), py::arg("scales"), py::arg("stream"),
      "MXFP8 along d: data [h, t, d], E8M0 scales [h, t, d / 32].");

  m.def(
      "per_chunk_cast_transposed",
      [](const NVTEExactFP8TokenView &v, const NVTEExactFP8Chunks &c, bool use_power_2_scales,
         float amax_epsilon, uintptr_t data_t, int64_t data_t_stride, uintptr_t scale_inv,
         uintptr_t stream) {
        check(nvte_exact_fp8_per_chunk_cast_transposed(
            &v, &c, use_power_2_scales, amax_epsilon, as_ptr<void>(data_t), data_t_stride,
            as_ptr<float>(scale_inv), as_stream(stream)));
      },
      py::arg("v"), py::arg("chunks"), py::arg("use_power_2_scales"), py::arg("amax_epsilon"),
      py::arg("data_t"), py::arg("data_t_stride"), py::arg("scale_inv"), py::arg("stream"),
      "E4M3 with one scale per (head, chunk): data_t [h, d, stride], scale_inv [h, n_chunks].");

  m.def(
      "per_chunk_cast_mxfp8_columnwise_transposed",
      [](const NVTEExactFP8TokenView &v, const NVTEExactFP8Chunks &c, uintptr_t data_t,
         int64_t data_t_stride, uintptr_t scales, uintptr_t stream) {
        check(nvte_exact_fp8_per_chunk_cast_mxfp8_columnwise_transposed(
            &v, &c, as_ptr<void>(data_t), data_t_stride, as_ptr<uint8_t>(scales),
            as_stream(stream)));
      },
      py::arg("v"), py::arg("chunks"), py::arg("data_t"), py::arg("data_t_stride"),
      py::arg("scales"), py::arg("stream"),
      "MXFP8 along the tokens: data_t [h, d, stride], E8M0 scales [h, n_chunks, d].");

  m.def(
      "sequence_offsets",
      [](uintptr_t cu_seqlens, int64_t num_seqs, int32_t chunk, uintptr_t cu_chunks,
         uintptr_t columns, uintptr_t stream) {
        check(nvte_exact_fp8_sequence_offsets(as_ptr<const int32_t>(cu_seqlens), num_seqs, chunk,
                                              as_ptr<int32_t>(cu_chunks), as_ptr<int32_t>(columns),
                                              as_stream(stream)));
      },
      py::arg("cu_seqlens"), py::arg("num_seqs"), py::arg("chunk"), py::arg("cu_chunks"),
      py::arg("columns"), py::arg("stream"),
      "A thd pack's chunk offsets and aligned columns (columns 0: not computed), on the device.");

  register_exact_fp8_attention(m);
}
