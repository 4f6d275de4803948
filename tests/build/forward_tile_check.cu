// Host program (no GPU): the sm90 forward's mask geometry (mainloop.h) against the rule of
// masks.allowed_positions and masks.fp8_tile_map, brute force over many shapes:
//   * kv_tile_range: the KV tiles some real row of a query tile sees, and the complete tiles
//     every real row sees whole (FP8), for no mask, causal top-left and bottom-right, sliding
//     windows (left, right, both), padding (real lengths below the allocation);
//   * KVTileRange::tile / visit: the visit order (right boundary, left boundary, FP8) and its
//     inverse;
//   * the element-wise mask of ScoreScales (softmax.h), replayed here: the keys a row sees;
//   * tail_visit: the visit of the incomplete last tile under zero_v_tail;
//   * v16_row_bytes (kernel_traits.h), d = 64 and 128: every element of a (key, 64-d half) of
//     SmemLayoutV16, addressed through cute's swizzled smem pointer as the TMA and WGMMA
//     partitions address it, lies in the 128-byte row that zero_v_tail zeroes, and the rows of
//     different pairs differ;
//   * k_scale_slot (kernel_traits.h): a permutation of a stage's 128 K scales whose slots the
//     producer's lanes write as two 8-byte pairs each, and where each consumer thread's 16-byte
//     word J (ScoreScales::scale_word, softmax.h) holds the scales of the keys that cute's
//     partition of S gives its values 8 J .. 8 J + 7, for every thread of the tiled MMA;
//   * TileCoord::decode (tile_scheduler.h), the persistent grid's work items: every query tile
//     of every (sequence, head) that has rows to write is one item, the others (past a thd
//     sequence's allocation) decode to q_tile -1; under a causal mask each (sequence, head)'s
//     tiles come longest first, and the items of one round of tiles run over all
//     (sequence, head)s before the next round.
// Prints "ok" and exits 0, or prints the first mismatches and exits 1. Run by
// tests/build/test_build_sm90_attention.py.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <set>
#include <vector>

#include "transformer_engine/common/fused_attn/exact_fp8_attention_sm90/mainloop.h"

using namespace transformer_engine::exact_fp8::sm90;

namespace {

int bad = 0;

void report(const char *what, int len_q, int len_kv, int causal, int left, int right, int qt,
            int got_a, int got_b, int want_a, int want_b) {
  if (bad++ < 10) {
    std::printf("%s: len_q %d len_kv %d causal %d window (%d, %d) tile %d: (%d, %d) vs "
                "(%d, %d)\n",
                what, len_q, len_kv, causal, left, right, qt, got_a, got_b, want_a, want_b);
  }
}

// The C API's mask arguments as the launcher turns them into AttentionParams.
AttentionParams params(int causal, int left, int right, bool padded) {
  AttentionParams p{};
  p.window_left = left < 0 ? kUnbounded : left;
  p.window_right = causal != 0 ? 0 : (right < 0 ? kUnbounded : right);
  p.bottom_right = causal != 1;
  p.zero_v_tail = padded;
  return p;
}

// masks.allowed_positions for a real row i and a position j (TE's rule, -1 unbounded).
bool sees(int i, int j, int len_q, int len_kv, int causal, int left, int right) {
  if (i >= len_q || j >= len_kv) return false;
  const int diag = causal == 1 ? 0 : len_kv - len_q;
  if (causal != 0) right = 0;
  if (right >= 0 && j > i + diag + right) return false;
  if (left >= 0 && j < i + diag - left) return false;
  return true;
}

void check_sequence(int len_q, int len_kv, int causal, int left, int right, bool padded) {
  const AttentionParams p = params(causal, left, right, padded);
  Sequence s{};
  s.len_q = len_q;
  s.len_kv = len_kv;
  s.span_q = len_q + (padded ? 37 : 0);
  s.diag = p.bottom_right ? len_kv - len_q : 0;
  const int num_q_tiles = (s.span_q + kQTile - 1) / kQTile;
  const int span_kv = len_kv + (padded ? 53 : 0);
  for (int qt = 0; qt < num_q_tiles; ++qt) {
    const int q0 = qt * kQTile, q_end = q0 + kQTile < len_q ? q0 + kQTile : len_q;
    // tiles some real row sees ([lo, hi)), and the complete tiles every real row sees whole
    int want_lo = -1, want_hi = -1, want_fp8_lo = -1, want_fp8_hi = -1;
    for (int kt = 0; kt * kKVTile < span_kv; ++kt) {
      bool any = false, all = q_end > q0 && (kt + 1) * kKVTile <= len_kv;
      for (int i = q0; i < q_end; ++i) {
        for (int j = kt * kKVTile; j < (kt + 1) * kKVTile; ++j) {
          const bool v = sees(i, j, len_q, len_kv, causal, left, right);
          any |= v;
          all &= v;
        }
      }
      if (any && want_lo < 0) want_lo = kt;
      if (any) want_hi = kt + 1;
      if (all && want_fp8_lo < 0) want_fp8_lo = kt;
      if (all) want_fp8_hi = kt + 1;
    }
    const KVTileRange r = kv_tile_range(p, s, qt);
    const int got_tiles = r.num_tiles(), want_tiles = want_lo < 0 ? 0 : want_hi - want_lo;
    if (got_tiles != want_tiles || (want_tiles > 0 && r.kv_lo != want_lo)) {
      report("tiles", len_q, len_kv, causal, left, right, qt, r.kv_lo, got_tiles, want_lo,
             want_tiles);
      continue;
    }
    const int got_fp8 = r.fp8_hi - r.fp8_lo;
    const int want_fp8 = want_fp8_lo < 0 ? 0 : want_fp8_hi - want_fp8_lo;
    if (got_fp8 != want_fp8 || (want_fp8 > 0 && r.fp8_lo != want_fp8_lo)) {
      report("fp8 tiles", len_q, len_kv, causal, left, right, qt, r.fp8_lo, got_fp8,
             want_fp8_lo, want_fp8);
      continue;
    }
    // the FP8 tiles are contiguous (windows move with the row): brute force agrees above only
    // if no tile between want_fp8_lo and want_fp8_hi is a boundary tile
    for (int kt = want_fp8_lo; kt >= 0 && kt < want_fp8_hi; ++kt) {
      bool all = true;
      for (int i = q0; i < q_end; ++i) {
        for (int j = kt * kKVTile; j < (kt + 1) * kKVTile; ++j) {
          all &= sees(i, j, len_q, len_kv, causal, left, right);
        }
      }
      if (!all) report("fp8 gap", len_q, len_kv, causal, left, right, qt, kt, 0, kt, 1);
    }
    // visit order: right boundary, left boundary, FP8; every tile once; visit() inverts tile()
    std::set<int> seen_tiles;
    for (int v = 0; v < got_tiles; ++v) {
      const int kt = r.tile(v);
      const bool boundary = v < r.num_boundary();
      const bool right_side = v < r.kv_hi - r.fp8_hi;
      if (kt < r.kv_lo || kt >= r.kv_hi || !seen_tiles.insert(kt).second || r.visit(kt) != v ||
          boundary == r.is_fp8(kt) || (boundary && right_side != (kt >= r.fp8_hi))) {
        report("visit order", len_q, len_kv, causal, left, right, qt, v, kt, v, -1);
      }
    }
    // the element-wise mask of a boundary tile, as ScoreScales computes it per row
    for (int i = q0; i < q0 + kQTile; ++i) {
      const int64_t first = std::max<int64_t>(int64_t(i) + s.diag - p.window_left, 0);
      const int64_t last =
          std::min<int64_t>(int64_t(i) + s.diag + p.window_right, int64_t(len_kv) - 1);
      const int first_key = static_cast<int>(first);
      const uint32_t num_keys =
          i < len_q && last >= first ? static_cast<uint32_t>(last - first + 1) : 0u;
      for (int j = 0; j < span_kv + kKVTile; ++j) {
        const bool got = static_cast<uint32_t>(j - first_key) < num_keys;
        if (got != sees(i, j, len_q, len_kv, causal, left, right)) {
          report("element mask", len_q, len_kv, causal, left, right, qt, i, j, got, !got);
          break;
        }
      }
    }
    // the tail visit: the incomplete last tile, when visited and zero_v_tail
    const int tail = tail_visit(p, s, r);
    const int kt_tail = len_kv / kKVTile;
    const bool want_tail = padded && len_kv % kKVTile != 0 && r.kv_lo <= kt_tail &&
                           kt_tail < r.kv_hi;
    if ((tail >= 0) != want_tail ||
        (want_tail && (r.tile(tail) != kt_tail || r.is_fp8(kt_tail)))) {
      report("tail visit", len_q, len_kv, causal, left, right, qt, tail, 0, want_tail, kt_tail);
    }
  }
}

// A 16-bit V tile's shared memory (1024-byte aligned, as SharedStorage::v): its elements are
// addressed as the kernel's TMA and WGMMA partitions address them, through cute's swizzled
// smem pointer, whose swizzle acts on byte addresses (not on the layout's element offsets).
alignas(1024) cutlass::bfloat16_t v16_tile[128 * 128];

template <int kHeadDim>
void check_v16_rows() {
  using Traits = KernelTraits<kHeadDim>;
  Tensor tile = make_tensor(make_smem_ptr(v16_tile), typename Traits::SmemLayoutV16{});
  std::set<int> rows;
  for (int key = 0; key < kKVTile; ++key) {
    for (int half = 0; half < kHeadDim / 64; ++half) {
      const int row = Traits::v16_row_bytes(key, half);
      if (row % 128 != 0 || row < 0 || row >= Traits::kV16TileBytes ||
          !rows.insert(row).second) {
        if (bad++ < 10) {
          std::printf("d %d: v16 row of key %d half %d: %d\n", kHeadDim, key, half, row);
        }
      }
      for (int d = 64 * half; d < 64 * half + 64; ++d) {
        const int bytes = static_cast<int>(reinterpret_cast<char const *>(&tile(d, key)) -
                                           reinterpret_cast<char const *>(v16_tile));
        if (bytes / 128 * 128 != row && bad++ < 10) {
          std::printf("d %d: v16 element (d %d, key %d) at byte %d, not in row %d\n", kHeadDim,
                      d, key, bytes, row);
        }
      }
    }
  }
}

// The K scales' order in shared memory: the producer's stores and every consumer thread's loads.
void check_k_scale_slots() {
  std::set<int> slots;
  for (int key = 0; key < kKVTile; ++key) slots.insert(k_scale_slot(key));
  if (slots.size() != kKVTile || *slots.begin() != 0 || *slots.rbegin() != kKVTile - 1) {
    if (bad++ < 10) std::printf("k_scale_slot: not a permutation of 0..127\n");
  }
  for (int lane = 0; lane < 32; ++lane) {  // mainloop.h: keys 4 lane + {0, 1} and + {2, 3}
    for (int pair = 0; pair < 2; ++pair) {
      const int key = 4 * lane + 2 * pair, slot = k_scale_slot(key);
      if ((slot % 2 != 0 || k_scale_slot(key + 1) != slot + 1) && bad++ < 10) {
        std::printf("k_scale_slot: keys %d, %d not in one aligned pair\n", key, key + 1);
      }
    }
  }
  using Traits = KernelTraits<128>;
  typename Traits::MmaQK mma;
  for (int thread = 0; thread < kMmaThreads; ++thread) {
    Tensor tScS = mma.get_thread_slice(thread).partition_C(
        make_identity_tensor(Shape<Int<kQTile>, Int<kKVTile>>{}));
    const int base = 2 * get<1>(tScS(0));  // ScoreScales::scale_word's offset in a word
    for (int v = 0; v < 64; ++v) {  // value v = 8 J + i reads float i of word J, as apply_fp8
      const int i = v % 8, slot = 16 * (v / 8) + base + (i & 1) + 2 * (i >> 2);
      const int key = get<1>(tScS(v));
      if (k_scale_slot(key) != slot && bad++ < 10) {
        std::printf("k scales: thread %d value %d (key %d) reads slot %d, its key's is %d\n",
                    thread, v, key, slot, k_scale_slot(key));
      }
    }
  }
}

// The work items of a launch over sequences of real lengths lens (thd when `thd`: packed with
// allocations of lens[n] + pads[n] rows, the grid covering the longest real one; else dense
// samples of seqlen rows), heads heads, mask `causal` (the C API's).
void check_items(std::vector<int> const &lens, std::vector<int> const &pads, int seqlen,
                 bool thd, int heads, int causal) {
  AttentionParams p = params(causal, -1, -1, thd);
  const int b = static_cast<int>(lens.size());
  std::vector<int32_t> cu(b + 1, 0), starts(b + 1, 0);
  int longest = 0;
  for (int n = 0; n < b; ++n) {
    cu[n + 1] = cu[n] + lens[n];
    starts[n + 1] = starts[n] + lens[n] + (thd ? pads[n] : 0);
    longest = lens[n] > longest ? lens[n] : longest;
  }
  p.batch = b;
  p.heads = heads;
  p.heads_kv = 1;
  p.cu_q = p.cu_kv = cu.data();
  if (thd) p.start_q = p.start_kv = starts.data();
  p.seqlen_q = thd ? longest : seqlen;
  p.seqlen_kv = thd ? 0 : seqlen;
  p.num_q_tiles = (p.seqlen_q + kQTile - 1) / kQTile;
  const int total = b * heads * p.num_q_tiles;
  std::set<std::vector<int>> seen;
  std::vector<int> last_tile(b * heads, 1 << 30);  // per (sequence, head): the last q_tile
  int written = 0;
  for (int item = 0; item < total; ++item) {
    Sequence s;
    const TileCoord c = TileCoord::decode(p, item, s);
    const int x = c.batch * heads + c.head;
    if (c.batch < 0 || c.batch >= b || c.head < 0 || c.head >= heads || x != item % (b * heads)) {
      if (bad++ < 10) std::printf("items: item %d decodes to (%d, %d)\n", item, c.batch, c.head);
      continue;
    }
    if (c.q_tile < 0) continue;
    ++written;
    if (c.q_tile * kQTile >= s.span_q || !seen.insert({c.batch, c.head, c.q_tile}).second) {
      if (bad++ < 10) {
        std::printf("items: item %d: tile %d of (%d, %d) past the span or twice\n", item,
                    c.q_tile, c.batch, c.head);
      }
    }
    // causal: the real tiles of a (sequence, head) longest (last) first, then the rest
    const int real_tiles = (s.len_q + kQTile - 1) / kQTile;
    if (causal != 0 && c.q_tile < real_tiles && c.q_tile > last_tile[x] && bad++ < 10) {
      std::printf("items: causal tile %d of (%d, %d) after tile %d\n", c.q_tile, c.batch,
                  c.head, last_tile[x]);
    }
    if (c.q_tile < real_tiles) last_tile[x] = c.q_tile;
  }
  int want = 0;  // the query tiles with rows to write: those within each allocation
  for (int n = 0; n < b; ++n) {
    const int span = thd ? lens[n] + pads[n] : seqlen;
    want += heads * std::min((span + kQTile - 1) / kQTile, p.num_q_tiles);
  }
  if (written != want && bad++ < 10) {
    std::printf("items: %d query tiles with rows, want %d\n", written, want);
  }
}

// The tile counter's protocol (draw_item, with its is_last_draw), replayed with `ctas` CTAs
// drawing in a random interleaving until each draws past the items: every item is drawn once,
// and exactly one draw, the launch's last, resets the counter.
void check_counter_protocol(int total, int ctas, unsigned seed) {
  int counter = 0, resets = 0, drawn = 0;
  std::vector<bool> done(ctas, false);
  std::vector<int> got(total, 0);
  int running = ctas;
  while (running > 0) {
    seed = seed * 1103515245u + 12345u;
    const int cta = static_cast<int>((seed >> 16) % ctas);
    if (done[cta]) continue;
    if (drawn == total + ctas) {  // a launch draws no more than this
      if (bad++ < 10) std::printf("counter: %d items, %d CTAs: more draws\n", total, ctas);
      return;
    }
    const int item = counter++;
    ++drawn;
    if (is_last_draw(item, total, ctas)) {
      if (drawn != total + ctas && bad++ < 10) std::printf("counter: reset before the end\n");
      counter = 0;
      ++resets;
    }
    if (item < total) {
      ++got[item];
    } else {
      done[cta] = true;
      --running;
    }
  }
  bool once = true;
  for (int g : got) once = once && g == 1;
  if ((!once || resets != 1 || counter != 0) && bad++ < 10) {
    std::printf("counter: %d items, %d CTAs: once %d, resets %d, counter %d\n", total, ctas,
                once, resets, counter);
  }
}

}  // namespace

int main() {
  const int lengths[] = {1, 5, 64, 127, 128, 129, 200, 255, 256, 300, 384, 640, 1000};
  // (left, right): no window, left only, right only, both; causal types force right = 0
  const int windows[][2] = {{-1, -1}, {0, -1}, {100, -1}, {256, -1}, {-1, 0}, {-1, 130},
                            {128, 0},  {300, 7}, {5, 5}};
  for (int len_q : lengths) {
    for (int len_kv : lengths) {
      for (int causal = 0; causal < 3; ++causal) {  // the C API's causal: 0, 1 (top-left), 2
        for (const auto &w : windows) {
          for (int padded = 0; padded < 2; ++padded) {
            check_sequence(len_q, len_kv, causal, w[0], w[1], padded != 0);
          }
        }
      }
    }
  }
  check_k_scale_slots();
  check_v16_rows<64>();
  check_v16_rows<128>();
  for (int causal = 0; causal < 3; ++causal) {
    for (int heads : {1, 3, 16}) {
      check_items({300, 300}, {0, 0}, 300, false, heads, causal);
      check_items({1, 1000, 129, 384}, {0, 0, 0, 0}, 1000, false, heads, causal);
      check_items({1, 1000, 129, 384}, {0, 200, 127, 1}, 0, true, heads, causal);
      check_items({77, 5}, {300, 0}, 0, true, heads, causal);
    }
  }
  for (int total : {1, 7, 132, 1000}) {
    for (int ctas : {1, 5, 132}) check_counter_protocol(total, ctas < total ? ctas : total, 7u);
  }
  if (bad == 0) std::printf("ok\n");
  return bad == 0 ? 0 : 1;
}
