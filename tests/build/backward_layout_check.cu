// Host program (no GPU): the sm90 backward's hand-computed shared-memory places against cute's
// layouts and fragments. Prints "ok" and exits 0, or prints the first mismatches and exits 1.
// Run by tests/build/test_build_sm90_attention.py.
#include <cstdint>
#include <cstdio>

#include "transformer_engine/common/fused_attn/exact_fp8_attention_sm90/backward_traits.h"

using namespace transformer_engine::exact_fp8::sm90;
using T = BackwardTraits;

int bad = 0;

void expect(bool ok, const char *what, int a, int b, int c) {
  if (!ok && bad++ < 10) std::printf("mismatch: %s (%d, %d, %d)\n", what, a, b, c);
}

int main() {
  // dS: the word a consumer thread stores for its S^T values v = 4 j + 2 h, v + 1 holds
  // SmemDs(row, key) and SmemDs(row + 1, key) at the fragment's coordinates.
  T::Bf16 *base = reinterpret_cast<T::Bf16 *>(uintptr_t(1) << 20);  // 1024-aligned, never read
  Tensor sDs = make_tensor(make_smem_ptr(base), T::SmemDs{});
  auto byte_of = [&](int row, int key) {
    return int(reinterpret_cast<char *>(raw_pointer_cast(&sDs(row, key))) -
               reinterpret_cast<char *>(base));
  };
  typename T::MmaScores mma_s;
  for (int t = 0; t < kBwdMmaThreads; ++t) {
    Tensor c = mma_s.get_thread_slice(t).partition_C(
        make_identity_tensor(Shape<Int<kBwdTile>, Int<kBwdStep>>{}));
    expect(size(c) == 32, "S^T values a thread", t, int(size(c)), 32);
    const uint32_t word_base = T::ds_word_base(t);
    for (int v = 0; v < 32; v += 2) {
      const int h = (v >> 1) & 1, j = v >> 2;
      const int key = get<0>(c(v)), row = get<1>(c(v));
      expect(get<0>(c(v + 1)) == key && get<1>(c(v + 1)) == row + 1, "pair", t, v, key);
      expect(key / 64 == t / 128, "a warpgroup's keys", t, v, key);
      const int at = int(T::ds_word_offset(word_base, h, j));
      expect(at == byte_of(row, key) && at + 2 == byte_of(row + 1, key), "dS word", t, v, at);
    }
  }
  // K_dq's bytes read as the B operand of dQ_n: SmemBf16TileT(d, key) is SmemBf16Tile(key, d).
  Tensor sK = make_tensor(make_smem_ptr(base), T::SmemBf16Tile{});
  Tensor sKt = make_tensor(make_smem_ptr(base), T::SmemBf16TileT{});
  for (int key = 0; key < kBwdTile; ++key) {
    for (int d = 0; d < kHeadDim; ++d) {
      expect(raw_pointer_cast(&sK(key, d)) == raw_pointer_cast(&sKt(d, key)), "K_dq^T", key, d, 0);
    }
  }
  // dQ_n: warpgroup w computes d half w of the 64 rows (the dQ writer's 16 KiB halves).
  typename T::MmaDq mma_dq;
  for (int t = 0; t < kBwdMmaThreads; ++t) {
    Tensor c = mma_dq.get_thread_slice(t).partition_C(
        make_identity_tensor(Shape<Int<kBwdStep>, Int<kHeadDim>>{}));
    expect(size(c) == 32, "dQ values a thread", t, int(size(c)), 32);
    for (int v = 0; v < 32; ++v) {
      expect(get<1>(c(v)) / 64 == t / 128, "a warpgroup's d half", t, v, get<1>(c(v)));
    }
  }
  if (bad == 0) std::printf("ok\n");
  return bad == 0 ? 0 : 1;
}
