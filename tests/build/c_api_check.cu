// Host program (no GPU): the argument checks of the sm90 forward's C API
// (exact_fp8_attention_sm90.h), linked against the compiled launcher object. Every call below
// is invalid, so the API must return NVTE_EXACT_FP8_INVALID_ARGUMENT with the expected message
// before any device work; the casts and the driver function it would call are stubs that fail
// the program if reached.
// Prints "ok" and exits 0, or the first mismatches and exits 1. Run by
// tests/build/test_build_sm90_attention.py.
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "transformer_engine/exact_fp8_attention_sm90.h"

extern "C" {
// The quantization library's entry points, which no invalid call may reach.
NVTEExactFP8Status nvte_exact_fp8_per_token_cast_pair(const NVTEExactFP8TokenView *, void *,
                                                      float *, const NVTEExactFP8TokenView *,
                                                      void *, float *, int, float, cudaStream_t) {
  std::printf("an invalid call reached the Q / K casts\n");
  std::exit(1);
}
NVTEExactFP8Status nvte_exact_fp8_per_chunk_cast_transposed(const NVTEExactFP8TokenView *,
                                                            const NVTEExactFP8Chunks *, int,
                                                            float, void *, int64_t, float *,
                                                            cudaStream_t) {
  std::printf("an invalid call reached the V cast\n");
  std::exit(1);
}
const char *nvte_exact_fp8_last_error(void) { return ""; }
// The driver's TMA descriptor encoder (driver_api.cu in the module), likewise never reached.
CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                        const cuuint64_t *, const cuuint64_t *,
                                        const cuuint32_t *, const cuuint32_t *,
                                        CUtensorMapInterleave, CUtensorMapSwizzle,
                                        CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  std::printf("an invalid call reached the tensor maps\n");
  std::exit(1);
}
}

namespace {

int bad = 0;
alignas(16) char buffer[256];  // stands in for every device array: never dereferenced
alignas(16) int32_t offsets[4];

// A valid dense call (bshd, causal), which each case below breaks in one way.
NVTEExactFP8AttentionSm90Args valid() {
  NVTEExactFP8AttentionSm90Args a{};
  a.q8 = a.k8 = a.v8t = a.v = buffer;
  a.q_scale = a.k_scale = a.v_scale = reinterpret_cast<const float *>(buffer);
  a.cu_chunks = a.cu_vt = offsets;
  a.out = buffer;
  a.lse = reinterpret_cast<float *>(buffer);
  a.batch = 2;
  a.seqlen_q = a.seqlen_kv = 256;
  a.heads = 4;
  a.heads_kv = 2;
  a.head_dim = 128;
  a.vt_width = 512;
  a.num_chunks = 4;
  a.causal = 1;
  a.softmax_scale = 0.088f;
  return a;
}

template <class Change>
void expect(const char *name, Change change, const char *message, bool quantizing = false) {
  NVTEExactFP8AttentionSm90Args a = valid();
  change(a);
  NVTEExactFP8Status status;
  if (quantizing) {
    NVTEExactFP8AttentionSm90QuantizingArgs q{};
    q.attention = a;
    status = nvte_exact_fp8_attention_sm90_fwd_quantizing(&q, nullptr);
  } else {
    status = nvte_exact_fp8_attention_sm90_fwd(&a, nullptr);
  }
  const std::string error = nvte_exact_fp8_attention_sm90_last_error();
  if (status != NVTE_EXACT_FP8_INVALID_ARGUMENT || error.find(message) == std::string::npos) {
    if (bad++ < 10) {
      std::printf("%s: status %d, message '%s', expected '%s'\n", name, int(status),
                  error.c_str(), message);
    }
  }
}

}  // namespace

int main() {
  using A = NVTEExactFP8AttentionSm90Args;
  expect("head dim", [](A &a) { a.head_dim = 96; }, "head_dim must be 64 or 128");
  expect("causal code", [](A &a) { a.causal = 3; }, "causal must be 0, 1 or 2");
  expect("one cu_seqlens", [](A &a) { a.cu_seqlens_q = offsets; },
         "cu_seqlens_q and cu_seqlens_kv go together");
  expect("one seq_starts", [](A &a) {
    a.cu_seqlens_q = a.cu_seqlens_kv = offsets;
    a.seq_starts_kv = offsets;
  }, "seq_starts_q and seq_starts_kv go together");
  expect("thd without lengths", [](A &a) {
    a.seq_starts_q = a.seq_starts_kv = offsets;
    a.tokens_q = a.tokens_kv = 100;
  }, "needs cu_seqlens_q/kv");
  expect("thd without tokens", [](A &a) {
    a.cu_seqlens_q = a.cu_seqlens_kv = a.seq_starts_q = a.seq_starts_kv = offsets;
  }, "thd needs tokens_q >= 1");
  expect("tokens of dense samples", [](A &a) { a.tokens_q = 7; },
         "tokens_q and tokens_kv are thd's");
  expect("sliding_window flag", [](A &a) { a.sliding_window = 2; },
         "sliding_window must be 0 or 1");
  expect("window side", [](A &a) {
    a.sliding_window = 1;
    a.window_left = -2;
  }, "window sides must be -1 or >= 0");
  expect("leaky with a window", [](A &a) {
    a.fp8_v_everywhere = 1;
    a.sliding_window = 1;
    a.window_left = 64;
    a.window_right = 0;
  }, "fp8_v_everywhere needs dense samples");
  expect("leaky with padding", [](A &a) {
    a.fp8_v_everywhere = 1;
    a.cu_seqlens_q = a.cu_seqlens_kv = offsets;
  }, "fp8_v_everywhere needs dense samples");
  expect("leaky with a right window", [](A &a) {
    a.fp8_v_everywhere = 1;
    a.causal = 0;
    a.sliding_window = 1;
    a.window_left = -1;
    a.window_right = 0;
  }, "fp8_v_everywhere needs dense samples");
  expect("leaky fp16", [](A &a) {
    a.fp8_v_everywhere = 1;
    a.dtype = NVTE_EXACT_FP8_FLOAT16;
  }, "built for bf16 and d = 128 only");
  expect("leaky d = 64", [](A &a) {
    a.fp8_v_everywhere = 1;
    a.head_dim = 64;
  }, "built for bf16 and d = 128 only");
  expect("thd tokens range", [](A &a) {
    a.cu_seqlens_q = a.cu_seqlens_kv = a.seq_starts_q = a.seq_starts_kv = offsets;
    a.tokens_q = int64_t(1) << 31;
    a.tokens_kv = 100;
  }, "out of range");
  expect("null pointer", [](A &a) { a.lse = nullptr; }, "a device pointer is null");
  expect("quantizing with sequences", [](A &a) { a.cu_seqlens_q = a.cu_seqlens_kv = offsets; },
         "the quantizing forward runs dense samples", true);
  expect("quantizing thd", [](A &a) {
    a.cu_seqlens_q = a.cu_seqlens_kv = a.seq_starts_q = a.seq_starts_kv = offsets;
    a.tokens_q = a.tokens_kv = 100;
  }, "the quantizing forward runs dense samples", true);
  if (bad == 0) std::printf("ok\n");
  return bad == 0 ? 0 : 1;
}
