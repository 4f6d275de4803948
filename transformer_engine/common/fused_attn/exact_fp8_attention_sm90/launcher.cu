/*
 * C API of the sm90 mask-exact FP8 attention forward (exact_fp8_attention_sm90.h): argument
 * checks, the TMA descriptors and the launch of kernel.h; the quantizing forward's casts.
 */
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "../exact_fp8_device_info.h"
#include "dynamic_smem.h"
#include "kernel.h"
#include "transformer_engine/exact_fp8_attention_sm90.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

thread_local std::string last_error;  // nvte_exact_fp8_attention_sm90_last_error's

namespace {

NVTEExactFP8Status fail(NVTEExactFP8Status status, const std::string &message) {
  last_error = std::string("nvte_exact_fp8_attention_sm90_fwd: ") + message;
  return status;
}

bool aligned16(const void *ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

bool is_thd(const NVTEExactFP8AttentionSm90Args &a) { return a.seq_starts_q != nullptr; }

/* Rows of Q8 / K8 (and their scales, the LSE): the pack's tokens (thd) or batch * seqlen. */
int64_t tokens_q(const NVTEExactFP8AttentionSm90Args &a) {
  return is_thd(a) ? a.tokens_q : a.batch * a.seqlen_q;
}
int64_t tokens_kv(const NVTEExactFP8AttentionSm90Args &a) {
  return is_thd(a) ? a.tokens_kv : a.batch * a.seqlen_kv;
}

std::string check_sequences(const NVTEExactFP8AttentionSm90Args &a) {
  if ((a.cu_seqlens_q == nullptr) != (a.cu_seqlens_kv == nullptr)) {
    return "cu_seqlens_q and cu_seqlens_kv go together";
  }
  if ((a.seq_starts_q == nullptr) != (a.seq_starts_kv == nullptr)) {
    return "seq_starts_q and seq_starts_kv go together";
  }
  if (is_thd(a) && a.cu_seqlens_q == nullptr) return "thd (seq_starts_*) needs cu_seqlens_q/kv";
  if (is_thd(a) && (a.tokens_q < 1 || a.tokens_kv < 0)) {
    return "thd needs tokens_q >= 1 and tokens_kv >= 0";
  }
  if (!is_thd(a) && (a.tokens_q != 0 || a.tokens_kv != 0)) {
    return "tokens_q and tokens_kv are thd's (0 for dense samples)";
  }
  if (a.sliding_window != 0 && a.sliding_window != 1) return "sliding_window must be 0 or 1";
  if (a.sliding_window && (a.window_left < -1 || a.window_right < -1)) {
    return "window sides must be -1 or >= 0";
  }
  return "";
}

std::string check(const NVTEExactFP8AttentionSm90Args &a) {
  if (a.head_dim != 64 && a.head_dim != 128) {
    return "head_dim must be 64 or 128, got " + std::to_string(a.head_dim);
  }
  if (a.batch < 1 || a.seqlen_q < 1 || a.seqlen_kv < 0 || a.heads < 1 || a.heads_kv < 1) {
    return "batch, seqlen_q, heads and heads_kv must be >= 1 and seqlen_kv >= 0";
  }
  if (a.heads % a.heads_kv != 0) return "heads_kv must divide heads";
  if (a.causal < 0 || a.causal > 2) return "causal must be 0, 1 or 2";
  const std::string sequences = check_sequences(a);
  if (!sequences.empty()) return sequences;
  if (a.fp8_v_everywhere != 0 && a.fp8_v_everywhere != 1) return "fp8_v_everywhere must be 0 or 1";
  if (a.dtype != NVTE_EXACT_FP8_BFLOAT16 && a.dtype != NVTE_EXACT_FP8_FLOAT16) {
    return "dtype must be NVTE_EXACT_FP8_BFLOAT16 or NVTE_EXACT_FP8_FLOAT16";
  }
  if (a.fp8_v_everywhere && (a.dtype != NVTE_EXACT_FP8_BFLOAT16 || a.head_dim != 128)) {
    return "fp8_v_everywhere (the leaky variant) is built for bf16 and d = 128 only";
  }
  // The leaky variant reads every tile as V8^T, whose ragged last group keeps the natural key
  // order (NVTE_EXACT_FP8_KEYS_SM90_PV): complete tiles of dense samples only.
  // a window that hides keys the mask type alone shows
  const bool window =
      a.sliding_window && (a.window_left >= 0 || (a.causal == 0 && a.window_right >= 0));
  if (a.fp8_v_everywhere && (a.seqlen_kv % kKVTile != 0 || a.cu_seqlens_q != nullptr || window)) {
    return "fp8_v_everywhere needs dense samples without cu_seqlens or window and seqlen_kv a "
           "multiple of 128, got seqlen_kv " + std::to_string(a.seqlen_kv);
  }
  if (a.vt_width % 16 != 0 || a.vt_width < 16) return "vt_width must be a multiple of 16";
  const int64_t limit = INT32_MAX;
  // the tile scheduler's counter draws items and one past them per CTA (< 2^31)
  if (tokens_q(a) > limit || tokens_kv(a) > limit ||
      a.heads * a.batch * ((a.seqlen_q + kQTile - 1) / kQTile) > limit / 2) {
    return "tokens or b * h * ceil(s_q / 128) out of range (t < 2^31, b * h * tiles < 2^30)";
  }
  if (!a.q8 || !a.q_scale || !a.k8 || !a.k_scale || !a.v8t || !a.v_scale || !a.cu_chunks ||
      !a.cu_vt || !a.v || !a.out || !a.lse) {
    return "a device pointer is null";
  }
  if (!aligned16(a.q8) || !aligned16(a.k8) || !aligned16(a.v8t) || !aligned16(a.v) ||
      !aligned16(a.out)) {
    return "q8, k8, v8t, v and out must be 16-byte aligned (TMA)";
  }
  if (a.v_stride_batch % 8 || a.v_stride_seq % 8 || a.out_stride_batch % 8 ||
      a.out_stride_seq % 8 || a.v_stride_batch < 0 || a.v_stride_seq < 0 ||
      a.out_stride_batch < 0 || a.out_stride_seq < 0) {
    return "the strides of v and out must be non-negative multiples of 8 elements (TMA)";
  }
  return "";
}

/* Element strides (batch, sequence) of v and out: the args', or the contiguous bshd layout's
 * where they are 0. */
int64_t v_stride_batch(const NVTEExactFP8AttentionSm90Args &a) {
  return a.v_stride_batch ? a.v_stride_batch : a.seqlen_kv * a.heads_kv * a.head_dim;
}
int64_t v_stride_seq(const NVTEExactFP8AttentionSm90Args &a) {
  return a.v_stride_seq ? a.v_stride_seq : a.heads_kv * a.head_dim;
}

/* The token view of V [batch, seqlen_kv, heads_kv, d] of `a`. */
NVTEExactFP8TokenView v_view(const NVTEExactFP8AttentionSm90Args &a) {
  return NVTEExactFP8TokenView{a.v,          static_cast<NVTEExactFP8DType>(a.dtype), a.batch,
                               a.seqlen_kv,  a.heads_kv,              a.head_dim,
                               v_stride_batch(a), v_stride_seq(a),    a.head_dim};
}

std::string check_view(const NVTEExactFP8TokenView &x, const char *name, int32_t dtype,
                       int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim) {
  if (x.dtype != dtype) return std::string(name) + "'s dtype must be the attention's dtype";
  if (x.batch != batch || x.seqlen != seqlen || x.heads != heads || x.head_dim != head_dim) {
    return std::string(name) + "'s view does not match the attention's shape";
  }
  return "";
}

/* The persistent grid's CTAs: one per SM, at most `items`, and at most
 * NVTE_EXACT_FP8_SM90_FWD_MAX_CTAS when that is set to a positive number (for tests and the
 * memory checker: few CTAs make every CTA walk many query tiles). */
int64_t persistent_ctas(int64_t items, int sms) {
  int64_t ctas = items < sms ? items : sms;
  if (const char *cap = std::getenv("NVTE_EXACT_FP8_SM90_FWD_MAX_CTAS")) {
    const long value = std::strtol(cap, nullptr, 10);
    if (value > 0 && value < ctas) ctas = value;
  }
  return ctas;
}

/* The tile counter of the next launch: the slots in turn, so that launches running at the same
 * time on different streams draw from different counters (tile_scheduler.h). */
int32_t next_counter_slot() {
  static std::atomic<uint32_t> next{0};
  return static_cast<int32_t>(next.fetch_add(1, std::memory_order_relaxed) % kTileCounterSlots);
}

/* The quantizing forward's second stream: the V cast runs there beside the Q and K cast, so that
 * each fills the other's ramp and tail (both are bound by memory bandwidth), joined before the
 * attention kernel. One stream and pair of events per host thread and device: events shared
 * between threads could order one thread's launches after another's. Created outside stream
 * capture only (a capture that finds none here casts on one stream). */
struct CastStreams {
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};

CastStreams *cast_streams(cudaStream_t stream) {
  thread_local CastStreams by_device[kMaxCachedDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device >= kMaxCachedDevices) return nullptr;
  CastStreams &c = by_device[device];
  if (c.side != nullptr) return &c;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone) {
    return nullptr;
  }
  CastStreams made;
  if (cudaStreamCreateWithFlags(&made.side, cudaStreamNonBlocking) != cudaSuccess ||
      cudaEventCreateWithFlags(&made.fork, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventCreateWithFlags(&made.join, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();  // clear it: the casts then run on one stream
    return nullptr;
  }
  c = made;
  return &c;
}

/* A failed cast's status, with the quantization API's message as this API's. */
NVTEExactFP8Status cast_failed(NVTEExactFP8Status status, const char *what) {
  return fail(status, std::string(what) + ": " + nvte_exact_fp8_last_error());
}

}  // namespace

// The forward of head dim kHeadDim (a checked call).
template <int kHeadDim>
NVTEExactFP8Status launch_head_dim(const NVTEExactFP8AttentionSm90Args &a, cudaStream_t stream) {
  using Traits = KernelTraits<kHeadDim>;
  using Fp8 = typename Traits::Fp8;
  using Bf16 = typename Traits::Bf16;
  const bool thd = is_thd(a);
  const int32_t b = static_cast<int32_t>(a.batch), h = static_cast<int32_t>(a.heads);
  const int32_t h_kv = static_cast<int32_t>(a.heads_kv);
  const int32_t s_q = static_cast<int32_t>(a.seqlen_q);
  const int32_t s_kv = thd ? 0 : static_cast<int32_t>(a.seqlen_kv);
  const int32_t t_q = static_cast<int32_t>(tokens_q(a));
  const int32_t t_kv = static_cast<int32_t>(tokens_kv(a));
  const int32_t width = static_cast<int32_t>(a.vt_width);
  // Without keys the descriptors still cover one row; no tile of them is ever loaded.
  const int32_t t_kv_desc = t_kv > 0 ? t_kv : 1;
  // V's tensor map: (d, rows, h_kv, samples) = (d, s_kv, h_kv, b) dense, (d, t_kv, h_kv, 1) thd
  const int32_t v_rows = thd ? t_kv_desc : (s_kv > 0 ? s_kv : 1), v_samples = thd ? 1 : b;

  KernelParams<Traits> kp{};
  AttentionParams &p = kp.p;
  p.q_scale = a.q_scale;
  p.k_scale = a.k_scale;
  p.v_scale = a.v_scale;
  p.cu_chunks = a.cu_chunks;
  p.cu_vt = a.cu_vt;
  p.cu_q = a.cu_seqlens_q;
  p.cu_kv = a.cu_seqlens_kv;
  p.start_q = a.seq_starts_q;
  p.start_kv = a.seq_starts_kv;
  p.out = a.out;
  p.lse = a.lse;
  p.batch = b;
  p.seqlen_q = s_q;
  p.seqlen_kv = s_kv;
  p.tokens_q = t_q;
  p.tokens_kv = t_kv;
  p.heads = h;
  p.heads_kv = h_kv;
  p.num_chunks = static_cast<int>(a.num_chunks);
  p.out_stride_seq = a.out_stride_seq ? a.out_stride_seq : a.heads * a.head_dim;
  p.out_stride_batch =
      thd ? 0 : (a.out_stride_batch ? a.out_stride_batch : a.seqlen_q * p.out_stride_seq);
  p.num_q_tiles = (s_q + kQTile - 1) / kQTile;
  // masks.allowed_positions: causal types bound the right side at 0; only top-left causal
  // aligns the diagonal at column 0
  const bool window = a.sliding_window != 0;
  p.window_left = window && a.window_left >= 0 ? a.window_left : kUnbounded;
  p.window_right =
      a.causal != 0 ? 0 : (window && a.window_right >= 0 ? a.window_right : kUnbounded);
  p.bottom_right = a.causal != 1;
  p.zero_v_tail = a.cu_seqlens_kv != nullptr;
  p.scale_log2 = static_cast<float>(static_cast<double>(a.softmax_scale) * 1.4426950408889634);
  kp.v_rows = v_rows;
  kp.v_samples = v_samples;
  kp.vt_width = width;

  using G = GmemLayouts<Traits>;
  const int64_t d = kHeadDim;
  // Q8 [h, t_q, d] as (t_q, d, h)
  auto mQ = make_tensor(make_gmem_ptr(static_cast<Fp8 const *>(a.q8)),
                        typename G::ShapeRows{t_q, kHeadDim, h},
                        typename G::StrideRows{d, _1{}, t_q * d});
  // K8 [h_kv, t_kv, d] as (t_kv, d, h_kv)
  auto mK = make_tensor(make_gmem_ptr(static_cast<Fp8 const *>(a.k8)),
                        typename G::ShapeRows{t_kv_desc, kHeadDim, h_kv},
                        typename G::StrideRows{d, _1{}, int64_t(t_kv_desc) * d});
  // V8^T [h_kv, d, width] as (d, width, h_kv)
  auto mVt = make_tensor(make_gmem_ptr(static_cast<Fp8 const *>(a.v8t)),
                         typename G::ShapeRows{kHeadDim, width, h_kv},
                         typename G::StrideVt{int64_t(width), _1{}, d * width});
  // V [b, s_kv, h_kv, d] or [t_kv, h_kv, d], bf16 or fp16 (its strides), as (d, rows, h_kv,
  // samples): the tensor map moves 16-bit words as they are (GmemLayouts::TmaV16), so one
  // serves both dtypes
  const int64_t v_ss = v_stride_seq(a);
  const int64_t v_sb = thd ? int64_t(v_rows) * v_ss
                           : (a.v_stride_batch ? a.v_stride_batch : int64_t(v_rows) * h_kv * d);
  auto mV = make_tensor(make_gmem_ptr(static_cast<Bf16 const *>(a.v)),
                        typename G::ShapeV{kHeadDim, v_rows, h_kv, v_samples},
                        typename G::StrideV{_1{}, v_ss, d, v_sb});
  kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, mQ, typename Traits::SmemLayoutRows{});
  kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, mK, typename Traits::SmemLayoutRows{});
  kp.tma_vt = make_tma_copy(SM90_TMA_LOAD{}, mVt, typename Traits::SmemLayoutVt{});
  kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, mV, typename Traits::SmemLayoutV16{});

  const int smem = static_cast<int>(sizeof(typename Traits::SharedStorage)) + 1024;
  // The mask-exact kernel for the input dtype, or the leaky benchmark / negative-control variant
  // (kernel.h; bf16 and d = 128 only, check()). allow_dynamic_smem keeps one flag per slot and
  // kernel type (the head dims' kernels differ in type).
  using Fp16 = typename Traits::Fp16;
  const bool leaky = a.fp8_v_everywhere != 0;
  const bool fp16 = a.dtype == NVTE_EXACT_FP8_FLOAT16;
  auto kernel = fp16 ? attention_fwd_kernel<Traits, false, Fp16>
                     : attention_fwd_kernel<Traits, false, Bf16>;
  if constexpr (kHeadDim == 128) {
    if (leaky) kernel = attention_fwd_kernel<Traits, true, Bf16>;
  }
  cudaError_t err = leaky  ? allow_dynamic_smem<SmemSlot::kForwardLeaky>(kernel, smem)
                    : fp16 ? allow_dynamic_smem<SmemSlot::kForwardFp16>(kernel, smem)
                           : allow_dynamic_smem<SmemSlot::kForward>(kernel, smem);
  if (err != cudaSuccess) return fail(NVTE_EXACT_FP8_CUDA_ERROR, cudaGetErrorString(err));
  // A persistent grid (tile_scheduler.h).
  int sms = 0;
  err = current_device_sm_count(&sms);
  if (err != cudaSuccess) return fail(NVTE_EXACT_FP8_CUDA_ERROR, cudaGetErrorString(err));
  const int64_t items = int64_t(b) * h * p.num_q_tiles;
  kp.total_items = static_cast<int32_t>(items);
  kp.counter_slot = next_counter_slot();
  const dim3 grid(static_cast<unsigned>(persistent_ctas(items, sms)));
  kernel<<<grid, kThreads, smem, stream>>>(kp);
  err = cudaGetLastError();
  if (err != cudaSuccess) return fail(NVTE_EXACT_FP8_CUDA_ERROR, cudaGetErrorString(err));
  return NVTE_EXACT_FP8_SUCCESS;
}

NVTEExactFP8Status launch(const NVTEExactFP8AttentionSm90Args &a, cudaStream_t stream) {
  return a.head_dim == 64 ? launch_head_dim<64>(a, stream) : launch_head_dim<128>(a, stream);
}

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

extern "C" {

int nvte_exact_fp8_attention_sm90_built(void) { return 1; }

NVTEExactFP8Status nvte_exact_fp8_attention_sm90_fwd(const NVTEExactFP8AttentionSm90Args *args,
                                                     cudaStream_t stream) {
  namespace s = transformer_engine::exact_fp8::sm90;
  if (args == nullptr) return s::fail(NVTE_EXACT_FP8_INVALID_ARGUMENT, "args is null");
  const std::string problem = s::check(*args);
  if (!problem.empty()) return s::fail(NVTE_EXACT_FP8_INVALID_ARGUMENT, problem);
  try {
    return s::launch(*args, stream);
  } catch (const std::exception &e) {  // none expected; never across the C boundary
    return s::fail(NVTE_EXACT_FP8_CUDA_ERROR, e.what());
  }
}

NVTEExactFP8Status nvte_exact_fp8_attention_sm90_fwd_quantizing(
    const NVTEExactFP8AttentionSm90QuantizingArgs *args, cudaStream_t stream) {
  namespace s = transformer_engine::exact_fp8::sm90;
  if (args == nullptr) return s::fail(NVTE_EXACT_FP8_INVALID_ARGUMENT, "args is null");
  const NVTEExactFP8AttentionSm90Args &a = args->attention;
  std::string problem = s::check(a);
  if (problem.empty() && (a.cu_seqlens_q != nullptr || a.seq_starts_q != nullptr)) {
    problem = "the quantizing forward runs dense samples (cu_seqlens and seq_starts null)";
  }
  if (problem.empty()) {
    problem = s::check_view(args->q, "q", a.dtype, a.batch, a.seqlen_q, a.heads, a.head_dim);
  }
  if (problem.empty()) {
    problem =
        s::check_view(args->k, "k", a.dtype, a.batch, a.seqlen_kv, a.heads_kv, a.head_dim);
  }
  if (!problem.empty()) return s::fail(NVTE_EXACT_FP8_INVALID_ARGUMENT, problem);
  const int pow2 = args->use_power_2_scales;
  // The V cast on the second stream (if there is one), forked from and joined back into stream
  s::CastStreams *two = a.seqlen_kv > 0 ? s::cast_streams(stream) : nullptr;
  const cudaStream_t v_stream = two != nullptr ? two->side : stream;
  if (two != nullptr && (cudaEventRecord(two->fork, stream) != cudaSuccess ||
                         cudaStreamWaitEvent(two->side, two->fork, 0) != cudaSuccess)) {
    return s::fail(NVTE_EXACT_FP8_CUDA_ERROR, cudaGetErrorString(cudaGetLastError()));
  }
  NVTEExactFP8Status st = NVTE_EXACT_FP8_SUCCESS;
  if (a.seqlen_kv > 0) {
    const NVTEExactFP8TokenView v = s::v_view(a);
    const bool aligned = a.batch > 1 && a.seqlen_kv % 16 != 0;  // the header's cu_vt rule
    const NVTEExactFP8Chunks chunks{nullptr,      a.cu_chunks, a.batch,
                                    a.num_chunks, s::kKVTile,  aligned ? a.cu_vt : nullptr,
                                    NVTE_EXACT_FP8_KEYS_SM90_PV};
    st = nvte_exact_fp8_per_chunk_cast_transposed(&v, &chunks, pow2, args->amax_epsilon,
                                                  const_cast<void *>(a.v8t), a.vt_width,
                                                  const_cast<float *>(a.v_scale), v_stream);
  }
  // Q and K in one launch (K's part is empty when seqlen_kv is 0), unless the V cast failed
  NVTEExactFP8Status st_qk = NVTE_EXACT_FP8_SUCCESS;
  if (st == NVTE_EXACT_FP8_SUCCESS) {
    st_qk = nvte_exact_fp8_per_token_cast_pair(
        &args->q, const_cast<void *>(a.q8), const_cast<float *>(a.q_scale), &args->k,
        const_cast<void *>(a.k8), const_cast<float *>(a.k_scale), pow2, args->amax_epsilon,
        stream);
  }
  // joined even after a failed cast: a captured stream must not end with the side stream forked
  if (two != nullptr && (cudaEventRecord(two->join, two->side) != cudaSuccess ||
                         cudaStreamWaitEvent(stream, two->join, 0) != cudaSuccess)) {
    return s::fail(NVTE_EXACT_FP8_CUDA_ERROR, cudaGetErrorString(cudaGetLastError()));
  }
  if (st != NVTE_EXACT_FP8_SUCCESS) return s::cast_failed(st, "the V cast");
  if (st_qk != NVTE_EXACT_FP8_SUCCESS) return s::cast_failed(st_qk, "the Q and K casts");
  try {
    return s::launch(a, stream);
  } catch (const std::exception &e) {  // none expected; never across the C boundary
    return s::fail(NVTE_EXACT_FP8_CUDA_ERROR, e.what());
  }
}

const char *nvte_exact_fp8_attention_sm90_last_error(void) {
  return transformer_engine::exact_fp8::sm90::last_error.c_str();
}

}  // extern "C"
