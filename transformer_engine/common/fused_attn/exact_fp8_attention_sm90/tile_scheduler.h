/*
 * The forward's persistent tile scheduler: one CTA per SM walks the query tiles, each taking the
 * next one from a global counter when it is ready for it (longest first, as the hardware hands
 * out CTAs), so that a CTA's next tile starts loading while its consumers finish the last one.
 *
 * Work items: (sequence, head, query tile), item = y * (batch * heads) + x with x = sequence *
 * heads + head: the order in which a grid of one CTA per item (x fastest) would start its CTAs.
 * Under a mask with a right bound (causal), y counts the sequence's query tiles from its last, so
 * the longest tiles of every (sequence, head) come first (TileCoord).
 *
 * The counter: tile_counters[slot], 0 before a launch. A CTA takes items with atomicAdd until it
 * draws one >= total; the gridDim.x draws past the last item are the CTAs' last, so the CTA that
 * draws total + gridDim.x - 1 knows every CTA has drawn its last and sets the counter back to 0
 * for the next launch on the stream. Launches that may run at the same time (other streams) use
 * other slots (the launcher hands them out in turn).
 *
 * Within a CTA, the producer warp draws the items and publishes each, with where the CTA's KV
 * ring and Q8 buffer stand at its start, in a two-entry ring in shared memory (TileRing) that
 * the consumer warpgroups and the tail warp read; the end of the walk is the item -1. An item
 * past its sequence's allocation (thd, TileCoord::q_tile -1) is published too and skipped by
 * every role.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_TILE_SCHEDULER_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_TILE_SCHEDULER_H_

#include <cutlass/arch/barrier.h>

#include "kernel_traits.h"
#include "params.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

constexpr int kTileCounterSlots = 64;  // launches that may run at once with their own counter
__device__ int tile_counters[kTileCounterSlots];  // [slots] int32, 0 between launches

// threadIdx.x by a volatile read, which the compiler does not hoist out of the walk's loop: what
// derives from it (fragment coordinates, lanes' offsets) is computed per tile instead of held in
// registers across the walk.
CUTLASS_DEVICE uint32_t thread_index_per_tile() {
  uint32_t tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  return tid;
}

// The item's query tile of one (sequence, head).
struct TileCoord {
  int batch;   // the sequence
  int head;
  int q_tile;  // -1: past the sequence's allocation (nothing to write)

  CUTLASS_HOST_DEVICE static TileCoord decode(AttentionParams const &p, int item, Sequence &seq) {
    const int bh = p.batch * p.heads;
    TileCoord c;
    const int x = item % bh, y = item / bh;
    c.batch = x / p.heads;
    c.head = x % p.heads;
    seq = Sequence::load(p, c.batch);
    const int real_tiles = (seq.len_q + kQTile - 1) / kQTile;
    c.q_tile = p.window_right != kUnbounded && y < real_tiles ? real_tiles - 1 - y : y;
    if (c.q_tile * kQTile >= seq.span_q) c.q_tile = -1;
    return c;
  }
};

// Whether draw `draw` (the counter's value it took) is the launch's last: each CTA draws until
// it gets a number >= total, so a launch of `ctas` CTAs draws total + ctas numbers.
CUTLASS_HOST_DEVICE bool is_last_draw(int draw, int total, int ctas) {
  return draw == total + ctas - 1;
}

// The next item of the launch for this CTA (>= total: none left); resets the counter after the
// launch's last draw.
CUTLASS_DEVICE int draw_item(int slot, int total) {
  const int item = atomicAdd(&tile_counters[slot], 1);
  uint32_t ctas;  // gridDim.x, read where used (volatile: not held in a register across the walk)
  asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(ctas));
  if (is_last_draw(item, total, static_cast<int>(ctas))) atomicExch(&tile_counters[slot], 0);
  return item;
}

// The two-entry ring of published items (TileRingStorage in shared memory): entry n % 2 holds
// the CTA's n-th item; full: the producer wrote it (1 arrival); empty: every reader took it.
struct TileRing {
  TileRingStorage &s;

  CUTLASS_DEVICE void init() {
    s.published = 0;
    for (int j = 0; j < 2; ++j) {
      cutlass::arch::ClusterBarrier::init(&s.full[j], 1);
      cutlass::arch::ClusterBarrier::init(&s.empty[j], TileRingStorage::kReaders);
    }
  }
  // Producer, one thread: publishes its n-th entry once the (n - 2)-th has been taken. (The
  // count lives in shared memory: the producer's registers are few.)
  CUTLASS_DEVICE void publish(TileEntry const &e) {
    const int n = s.published;
    const int j = n & 1;
    if (n >= 2) cutlass::arch::ClusterBarrier::wait(&s.empty[j], ((n >> 1) - 1) & 1);
    s.entry[j] = e;
    s.published = n + 1;
    cutlass::arch::ClusterBarrier::arrive(&s.full[j]);  // release: the entry
  }
  // Readers: the n-th entry (item -1: the walk is over). The arrive releases the read.
  CUTLASS_DEVICE TileEntry take(int n) {
    const int j = n & 1;
    cutlass::arch::ClusterBarrier::wait(&s.full[j], (n >> 1) & 1);
    const TileEntry e = s.entry[j];
    cutlass::arch::ClusterBarrier::arrive(&s.empty[j]);
    return e;
  }
};

// A reader's walk (the consumers', the tail warp's): f(entry, sequence, coordinates) for each
// published item with rows to write, in order, until the end of the CTA's walk.
template <class F>
CUTLASS_DEVICE void for_each_tile(TileRing ring, AttentionParams const &p, F &&f) {
  for (int n = 0;; ++n) {
    const TileEntry e = ring.take(n);
    if (e.item < 0) return;
    Sequence seq;
    const TileCoord c = TileCoord::decode(p, e.item, seq);
    if (c.q_tile >= 0) f(e, seq, c);
  }
}

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_TILE_SCHEDULER_H_
