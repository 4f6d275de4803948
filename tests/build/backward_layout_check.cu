// Host program (no GPU): the sm90 backward's hand-computed shared-memory places against cute's
// layouts and fragments, and the order of the dQ contributions (Note [Ordered dQ accumulation])
// over many shapes. Prints "ok" and exits 0, or prints the first mismatches and exits 1.
// Run by tests/build/test_build_sm90_attention.py.
#include <cstdint>
#include <cstdio>

#include <vector>

#include "transformer_engine/common/fused_attn/exact_fp8_attention_sm90/backward_dq_accum.h"

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
  typename T::MmaDp mma_dp;  // dS^T's accumulator: the same fragment as S^T's
  for (int t = 0; t < kBwdMmaThreads; ++t) {
    Tensor c = mma_s.get_thread_slice(t).partition_C(
        make_identity_tensor(Shape<Int<kBwdTile>, Int<kBwdStep>>{}));
    Tensor c_dp = mma_dp.get_thread_slice(t).partition_C(
        make_identity_tensor(Shape<Int<kBwdTile>, Int<kBwdStep>>{}));
    for (int v = 0; v < 32; ++v) expect(c(v) == c_dp(v), "S^T and dP^T fragments", t, v, 0);
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
  // K_dq's bytes read as the B operand of dQ_n: Smem16TileT(d, key) is Smem16Tile(key, d).
  Tensor sK = make_tensor(make_smem_ptr(base), T::Smem16Tile{});
  Tensor sKt = make_tensor(make_smem_ptr(base), T::Smem16TileT{});
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
  // The dQ order: for every (head of the group, row block), the key tiles whose steps visit it
  // expect the counts 0, 1, ..., k - 1, each once, in descending tile order; every row block
  // has a contribution (the store that initializes its accumulator).
  const int lengths[] = {1, 63, 64, 65, 127, 128, 129, 200, 300, 384, 1000, 1024, 4096};
  for (int s_q : lengths) {
    for (int s_kv : lengths) {
      for (int causal = 0; causal < 2; ++causal) {
        for (int group : {1, 3}) {
          BackwardParams p{};
          p.seqlen_q = s_q;
          p.seqlen_kv = s_kv;
          p.heads = group;
          p.heads_kv = 1;
          p.causal = causal;
          p.row_blocks = (s_q + kBwdStep - 1) / kBwdStep;
          const int tiles = (s_kv + kBwdTile - 1) / kBwdTile;
          // expected[g][m]: the tiles' expected counts, in descending tile order
          std::vector<std::vector<int>> seen(group * p.row_blocks);
          for (int n = tiles - 1; n >= 0; --n) {
            const BackwardSteps steps(p, n);
            for (int step = 0; step < steps.count(); ++step) {
              const int g = steps.head_in_group(step), m = steps.row_block(step);
              expect(g >= 0 && g < group && m >= 0 && m < p.row_blocks, "step range", s_q, s_kv, n);
              // a causal tile is visited only by row blocks that see its first key
              expect(!causal || n * kBwdTile <= m * kBwdStep + kBwdStep - 1, "visit", s_q, s_kv, n);
              seen[g * p.row_blocks + m].push_back(contributions_before(p, n, m));
            }
          }
          for (size_t i = 0; i < seen.size(); ++i) {
            expect(!seen[i].empty(), "a block without contributions", s_q, s_kv, int(i));
            for (size_t c = 0; c < seen[i].size(); ++c) {
              expect(seen[i][c] == int(c), "count order", s_q, s_kv, causal * 10 + group);
            }
          }
        }
      }
    }
  }
  if (bad == 0) std::printf("ok\n");
  return bad == 0 ? 0 : 1;
}
