/*
 * The attention functions of the Python module `transformer_engine_exact_fp8` (registered by
 * exact_fp8_binding.cpp): the C API of exact_fp8_attention_sm90.h, when the module was built
 * with the sm_90a kernel (NVTE_EXACT_FP8_WITH_SM90_ATTENTION). Without it the module has no
 * `attention_sm90_fwd`, which is how Python tells (exact_fp8/kernels.py).
 *
 * Tensors travel as device pointers (Python ints), the stream as an int. A failed call raises
 * ValueError (invalid argument) or RuntimeError (CUDA error) with the C API's message.
 * attention_sm90_fwd takes quantized operands; attention_sm90_fwd_quantizing the bf16 inputs
 * (the casts and the attention in one call); attention_sm90_bwd the backward.
 */
#include <pybind11/pybind11.h>

#include <cstdint>

#ifdef NVTE_EXACT_FP8_WITH_SM90_ATTENTION
#include "exact_fp8_binding_util.h"
#include "transformer_engine/exact_fp8_attention_sm90.h"
#endif

namespace py = pybind11;

#ifdef NVTE_EXACT_FP8_WITH_SM90_ATTENTION
namespace {

NVTEExactFP8AttentionSm90Args attention_args(
    uintptr_t q8, uintptr_t q_scale, uintptr_t k8, uintptr_t k_scale, uintptr_t v8t,
    uintptr_t v_scale, uintptr_t cu_chunks, uintptr_t cu_vt, uintptr_t v, uintptr_t out,
    uintptr_t lse, int64_t batch, int64_t seqlen_q, int64_t seqlen_kv, int64_t heads,
    int64_t heads_kv, int64_t head_dim, int64_t vt_width, int64_t num_chunks, int64_t causal,
    float softmax_scale, bool fp8_v_everywhere, int64_t v_stride_batch, int64_t v_stride_seq,
    int64_t out_stride_batch, int64_t out_stride_seq, int64_t dtype, int64_t window_left,
    int64_t window_right) {
  NVTEExactFP8AttentionSm90Args a{};
  a.q8 = reinterpret_cast<const void *>(q8);
  a.q_scale = reinterpret_cast<const float *>(q_scale);
  a.k8 = reinterpret_cast<const void *>(k8);
  a.k_scale = reinterpret_cast<const float *>(k_scale);
  a.v8t = reinterpret_cast<const void *>(v8t);
  a.v_scale = reinterpret_cast<const float *>(v_scale);
  a.cu_chunks = reinterpret_cast<const int32_t *>(cu_chunks);
  a.cu_vt = reinterpret_cast<const int32_t *>(cu_vt);
  a.v = reinterpret_cast<const void *>(v);
  a.out = reinterpret_cast<void *>(out);
  a.lse = reinterpret_cast<float *>(lse);
  a.batch = batch;
  a.seqlen_q = seqlen_q;
  a.seqlen_kv = seqlen_kv;
  a.heads = heads;
  a.heads_kv = heads_kv;
  a.head_dim = head_dim;
  a.vt_width = vt_width;
  a.num_chunks = num_chunks;
  a.causal = static_cast<int32_t>(causal);
  a.softmax_scale = softmax_scale;
  a.fp8_v_everywhere = fp8_v_everywhere ? 1 : 0;
  a.v_stride_batch = v_stride_batch;
  a.v_stride_seq = v_stride_seq;
  a.out_stride_batch = out_stride_batch;
  a.out_stride_seq = out_stride_seq;
  a.dtype = static_cast<int32_t>(dtype);
  a.sliding_window = window_left >= 0 || window_right >= 0 ? 1 : 0;  // -1, -1: none
  a.window_left = static_cast<int32_t>(window_left);
  a.window_right = static_cast<int32_t>(window_right);
  return a;
}

void check(NVTEExactFP8Status status) {
  exact_fp8_binding::raise_on_failure(status, nvte_exact_fp8_attention_sm90_last_error);
}

}  // namespace
#endif

void register_exact_fp8_attention(py::module_ &m) {
#ifdef NVTE_EXACT_FP8_WITH_SM90_ATTENTION
  m.def(
      "attention_sm90_fwd",
      [](uintptr_t q8, uintptr_t q_scale, uintptr_t k8, uintptr_t k_scale, uintptr_t v8t,
         uintptr_t v_scale, uintptr_t cu_chunks, uintptr_t cu_vt, uintptr_t v, uintptr_t out,
         uintptr_t lse, int64_t batch, int64_t seqlen_q, int64_t seqlen_kv, int64_t heads,
         int64_t heads_kv, int64_t head_dim, int64_t vt_width, int64_t num_chunks, int64_t causal,
         float softmax_scale, bool fp8_v_everywhere, int64_t v_stride_batch, int64_t v_stride_seq,
         int64_t out_stride_batch, int64_t out_stride_seq, int64_t dtype, uintptr_t cu_seqlens_q,
         uintptr_t cu_seqlens_kv, uintptr_t seq_starts_q, uintptr_t seq_starts_kv,
         int64_t tokens_q, int64_t tokens_kv, int64_t window_left, int64_t window_right,
         uintptr_t stream) {
        NVTEExactFP8AttentionSm90Args a = attention_args(
            q8, q_scale, k8, k_scale, v8t, v_scale, cu_chunks, cu_vt, v, out, lse, batch,
            seqlen_q, seqlen_kv, heads, heads_kv, head_dim, vt_width, num_chunks, causal,
            softmax_scale, fp8_v_everywhere, v_stride_batch, v_stride_seq, out_stride_batch,
            out_stride_seq, dtype, window_left, window_right);
        a.cu_seqlens_q = reinterpret_cast<const int32_t *>(cu_seqlens_q);
        a.cu_seqlens_kv = reinterpret_cast<const int32_t *>(cu_seqlens_kv);
        a.seq_starts_q = reinterpret_cast<const int32_t *>(seq_starts_q);
        a.seq_starts_kv = reinterpret_cast<const int32_t *>(seq_starts_kv);
        a.tokens_q = tokens_q;
        a.tokens_kv = tokens_kv;
        check(nvte_exact_fp8_attention_sm90_fwd(&a, reinterpret_cast<cudaStream_t>(stream)));
      },
      py::arg("q8"), py::arg("q_scale"), py::arg("k8"), py::arg("k_scale"), py::arg("v8t"),
      py::arg("v_scale"), py::arg("cu_chunks"), py::arg("cu_vt"), py::arg("v"), py::arg("out"),
      py::arg("lse"), py::arg("batch"), py::arg("seqlen_q"), py::arg("seqlen_kv"),
      py::arg("heads"), py::arg("heads_kv"), py::arg("head_dim"), py::arg("vt_width"),
      py::arg("num_chunks"), py::arg("causal"), py::arg("softmax_scale"),
      py::arg("fp8_v_everywhere"), py::arg("v_stride_batch"), py::arg("v_stride_seq"),
      py::arg("out_stride_batch"), py::arg("out_stride_seq"), py::arg("dtype"),
      py::arg("cu_seqlens_q"), py::arg("cu_seqlens_kv"), py::arg("seq_starts_q"),
      py::arg("seq_starts_kv"), py::arg("tokens_q"), py::arg("tokens_kv"), py::arg("window_left"),
      py::arg("window_right"), py::arg("stream"),
      "Mask-exact FP8 attention forward on sm_90a (bshd views or thd, d = 64 or 128, bf16 or "
      "fp16: "
      "dtype 0 or 1, current scaling; causal 0 none, 1 top-left, 2 bottom-right; a sliding "
      "window, -1 for an unbounded side; cu_seqlens (0: dense), seq_starts and tokens (thd; 0: "
      "dense)): out [b, s_q, h, d] or [t_q, h, d] in that dtype (element strides of its batch "
      "and sequence dims, 0: contiguous), lse [h, t_q] fp32; v likewise; fp8_v_everywhere: "
      "the LEAKY benchmark and negative-control mode (bf16). See exact_fp8_attention_sm90.h.");
  m.def(
      "attention_sm90_fwd_quantizing",
      [](uintptr_t q, int64_t q_stride_batch, int64_t q_stride_seq, int64_t q_stride_head,
         uintptr_t k, int64_t k_stride_batch, int64_t k_stride_seq, int64_t k_stride_head,
         bool use_power_2_scales, float amax_epsilon, uintptr_t q8, uintptr_t q_scale,
         uintptr_t k8, uintptr_t k_scale, uintptr_t v8t, uintptr_t v_scale, uintptr_t cu_chunks,
         uintptr_t cu_vt, uintptr_t v, uintptr_t out, uintptr_t lse, int64_t batch,
         int64_t seqlen_q, int64_t seqlen_kv, int64_t heads, int64_t heads_kv, int64_t head_dim,
         int64_t vt_width, int64_t num_chunks, int64_t causal, float softmax_scale,
         bool fp8_v_everywhere, int64_t v_stride_batch, int64_t v_stride_seq,
         int64_t out_stride_batch, int64_t out_stride_seq, int64_t dtype, int64_t window_left,
         int64_t window_right, uintptr_t stream) {
        NVTEExactFP8AttentionSm90QuantizingArgs a{};
        using exact_fp8_binding::token_view;
        const auto type = static_cast<NVTEExactFP8DType>(dtype);
        a.q = token_view(q, type, batch, seqlen_q, heads, head_dim, q_stride_batch, q_stride_seq,
                         q_stride_head);
        a.k = token_view(k, type, batch, seqlen_kv, heads_kv, head_dim, k_stride_batch,
                         k_stride_seq, k_stride_head);
        a.use_power_2_scales = use_power_2_scales ? 1 : 0;
        a.amax_epsilon = amax_epsilon;
        a.attention = attention_args(q8, q_scale, k8, k_scale, v8t, v_scale, cu_chunks, cu_vt, v,
                                     out, lse, batch, seqlen_q, seqlen_kv, heads, heads_kv,
                                     head_dim, vt_width, num_chunks, causal, softmax_scale,
                                     fp8_v_everywhere, v_stride_batch, v_stride_seq,
                                     out_stride_batch, out_stride_seq, dtype, window_left,
                                     window_right);
        check(nvte_exact_fp8_attention_sm90_fwd_quantizing(
            &a, reinterpret_cast<cudaStream_t>(stream)));
      },
      "The forward of dense samples from bf16 or fp16 (dtype 0 or 1) q (bshd view: element "
      "strides) and k (same) and v (batch and sequence strides, 0: contiguous), a sliding "
      "window (-1: an unbounded side): "
      "the Q, K and V casts into the given buffers, then attention_sm90_fwd, in one call "
      "(positional arguments only: the host time of small calls). See "
      "nvte_exact_fp8_attention_sm90_fwd_quantizing in exact_fp8_attention_sm90.h.");
  m.def(
      "attention_sm90_bwd",
      [](uintptr_t q8, uintptr_t q_dq, uintptr_t k8, uintptr_t k_dq, uintptr_t k_scale,
         uintptr_t v, uintptr_t d_out, uintptr_t row_values, uintptr_t dq, uintptr_t dk,
         uintptr_t dv, int64_t batch, int64_t seqlen_q, int64_t seqlen_kv, int64_t heads,
         int64_t heads_kv, int64_t head_dim, bool causal, float softmax_scale,
         int64_t v_stride_batch, int64_t v_stride_seq, int64_t d_out_stride_batch,
         int64_t d_out_stride_seq, int64_t dq_stride_batch, int64_t dq_stride_seq,
         int64_t dkv_stride_batch, int64_t dkv_stride_seq, uintptr_t dq_accum,
         uintptr_t dq_count, int64_t dtype, uintptr_t stream) {
        NVTEExactFP8AttentionSm90BwdArgs a{};
        a.q8 = reinterpret_cast<const void *>(q8);
        a.q_dq = reinterpret_cast<const void *>(q_dq);
        a.k8 = reinterpret_cast<const void *>(k8);
        a.k_dq = reinterpret_cast<const void *>(k_dq);
        a.k_scale = reinterpret_cast<const float *>(k_scale);
        a.v = reinterpret_cast<const void *>(v);
        a.d_out = reinterpret_cast<const void *>(d_out);
        a.row_values = reinterpret_cast<const float *>(row_values);
        a.dq = reinterpret_cast<void *>(dq);
        a.dk = reinterpret_cast<void *>(dk);
        a.dv = reinterpret_cast<void *>(dv);
        a.batch = batch;
        a.seqlen_q = seqlen_q;
        a.seqlen_kv = seqlen_kv;
        a.heads = heads;
        a.heads_kv = heads_kv;
        a.head_dim = head_dim;
        a.causal = causal ? 1 : 0;
        a.softmax_scale = softmax_scale;
        a.v_stride_batch = v_stride_batch;
        a.v_stride_seq = v_stride_seq;
        a.d_out_stride_batch = d_out_stride_batch;
        a.d_out_stride_seq = d_out_stride_seq;
        a.dq_stride_batch = dq_stride_batch;
        a.dq_stride_seq = dq_stride_seq;
        a.dkv_stride_batch = dkv_stride_batch;
        a.dkv_stride_seq = dkv_stride_seq;
        a.dq_accum = reinterpret_cast<float *>(dq_accum);
        a.dq_count = reinterpret_cast<int32_t *>(dq_count);
        a.dtype = static_cast<int32_t>(dtype);
        check(nvte_exact_fp8_attention_sm90_bwd(&a, reinterpret_cast<cudaStream_t>(stream)));
      },
      "Mask-exact FP8 attention backward on sm_90a (the forward's subset): dq, dk, dv from the "
      "forward's FP8 operands, their dequantized bf16 copies, the padded K scales and the row "
      "values; the batch and sequence strides of v, d_out, dq and dk / dv (0: contiguous bshd); "
      "the dQ accumulator and its counters (scratch); dtype 0 (bf16) or 1 (fp16) "
      "(positional arguments only). See nvte_exact_fp8_attention_sm90_bwd in "
      "exact_fp8_attention_sm90.h.");
#else
  (void)m;
#endif
}
