/*
 * dQ of the sm90 mask-exact FP8 attention backward: the ordered accumulation of the key tiles'
 * contributions (the producer warpgroup's second warp) and the kernel that turns the
 * accumulator into dQ.
 *
 * Note [Ordered dQ accumulation]
 * ------------------------------
 * A CTA of the backward owns 128 keys and walks the 64-row blocks that see them; each step adds
 * dQ_n = dS . K_dq of its keys to the block's dQ. Several CTAs add to one block, so the sum must
 * be ordered to stay deterministic (fp32 addition does not associate; issue 21 asks for bitwise
 * reproducible gradients):
 *
 *   - the accumulator of (head, sample, block) is a 32 KiB fp32 chunk of `dq_accum`, in the
 *     consumer threads' fragment order: [warpgroup][v / 4][thread][v % 4] for value v of a
 *     thread's 32 (the d half of warpgroup w is its 16 KiB); the store kernel below maps it back
 *     to (row, d), as the fragment's coordinates say;
 *   - the key tiles add in DESCENDING order: the block's first contribution comes from the last
 *     key tile that sees it and is STORED (no zeroing pass), every later one is ADDED by a bulk
 *     reduce (`cp.reduce.async.bulk .add.f32`);
 *   - `dq_count[head, sample, block]` counts the contributions done; the writer of key tile n
 *     waits until it equals the number of key tiles above n that see the block (acquire), adds,
 *     waits for the bulk operation to COMPLETE (not only to have read shared memory: a later
 *     reduce of another SM must not overtake it), then increments the count (release).
 *
 * Causal (top-left) masks: key tile n sees row blocks m >= 2n, so it reaches block m two steps
 * after tile n + 1 does: CTAs launched highest key tile first (shortest first) meet a count
 * that is already there, and no CTA ever waits for one launched after it (no deadlock).
 * No mask: every tile adds to every block, one after another, highest tile first.
 *
 * The order is a function of the shape alone, so dQ is bitwise reproducible; it is not the
 * order of the two-kernel backward (dQ summed over 64-key steps in ascending order), so the two
 * agree to fp32 rounding, not bit for bit.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_DQ_ACCUM_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_DQ_ACCUM_H_

#include <cutlass/arch/barrier.h>

#include <cute/tensor.hpp>

#include "backward_common.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

// Named barriers between the consumer warpgroups and the dQ writer (ids after CUTLASS's
// reserved ones; cutlass::arch::NamedBarrier adds the offset).
enum BwdNamedBarrier : uint32_t {
  kBarDsReady = 0,  // both consumer warpgroups wrote the step's dS (256 threads)
  kBarDqFull = 1,   // + warpgroup: its dQ_n is in shared memory (the warpgroup + the writer)
  kBarDqEmpty = 3,  // + warpgroup: the writer has read it (the warpgroup + the writer)
};
constexpr uint32_t kDqSyncThreads = 128 + 32;

// The row blocks of a CTA: steps (g, m) for g < group, m_begin <= m < m_begin + num_m, head-major.
struct BackwardSteps {
  int m_begin;
  int num_m;
  int group;

  CUTE_HOST_DEVICE BackwardSteps(BackwardParams const &p, int key_tile) {
    // causal: rows i >= the tile's first key see it; the tile's first key is a multiple of
    // kBwdStep
    m_begin = p.causal ? key_tile * kBwdTile / kBwdStep : 0;
    num_m = p.row_blocks > m_begin ? p.row_blocks - m_begin : 0;
    group = p.heads / p.heads_kv;
  }
  CUTE_HOST_DEVICE int count() const { return group * num_m; }
  CUTE_HOST_DEVICE int head_in_group(int step) const { return step / num_m; }
  CUTE_HOST_DEVICE int row_block(int step) const { return m_begin + step % num_m; }
};

// Contributions to row block m that come before key tile n's (Note [Ordered dQ accumulation]):
// the tiles above n that see the block.
CUTE_HOST_DEVICE int contributions_before(BackwardParams const &p, int key_tile, int m) {
  const int num_key_tiles = (p.seqlen_kv + kBwdTile - 1) / kBwdTile;
  const int seen_by_m = m * kBwdStep / kBwdTile + 1;  // causal: tiles 0 .. m * 64 / 128
  const int tiles = p.causal && seen_by_m < num_key_tiles ? seen_by_m : num_key_tiles;
  return tiles - 1 - key_tile;
}

// ---- bulk copies and the count (one thread) ----

CUTLASS_DEVICE void bulk_store(float *gmem, float const *smem, int bytes) {
  const uint32_t src = cute::cast_smem_ptr_to_uint(smem);
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(gmem),
               "r"(src), "r"(bytes)
               : "memory");
}

CUTLASS_DEVICE void bulk_reduce_add(float *gmem, float const *smem, int bytes) {
  const uint32_t src = cute::cast_smem_ptr_to_uint(smem);
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem),
      "r"(src), "r"(bytes)
      : "memory");
}

CUTLASS_DEVICE void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// The bulk operations have read their shared memory (it may be overwritten).
CUTLASS_DEVICE void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// The bulk operations are complete: their global writes are done.
CUTLASS_DEVICE void bulk_wait_complete() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// Orders this thread's generic-proxy accesses of global memory with its async-proxy (bulk) ones.
CUTLASS_DEVICE void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

CUTLASS_DEVICE void wait_count(int const *count, int expected) {
  int value;
  while (true) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(value) : "l"(count) : "memory");
    if (value == expected) return;
    __nanosleep(32);
  }
}

CUTLASS_DEVICE void increment_count(int *count) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(count) : "memory");
}

// The producer warpgroup's second warp: per step, the two consumer warpgroups' dQ_n added to
// the block's accumulator in the order of Note [Ordered dQ accumulation].
struct DqWriter {
  using T = BackwardTraits;
  BackwardParams const &p;
  typename T::SharedStorage &ss;
  int key_tile, kv_head, batch;

  CUTLASS_DEVICE void run(BackwardSteps const &steps) {
    using cutlass::arch::NamedBarrier;
    const bool leader = cute::elect_one_sync();
    const int num_steps = steps.count();
    if (num_steps == 0) return;
#pragma unroll
    for (int wg = 0; wg < 2; ++wg) NamedBarrier::arrive(kDqSyncThreads, kBarDqEmpty + wg);
    for (int step = 0; step < num_steps; ++step) {
      const int head = kv_head * steps.group + steps.head_in_group(step);
      const int m = steps.row_block(step);
      const int64_t block = (static_cast<int64_t>(head) * p.batch + batch) * p.row_blocks + m;
      int *count = p.dq_count + block;
      float *accum = p.dq_accum + block * 2 * kDqHalfFloats;
      const int before = contributions_before(p, key_tile, m);
      if (leader) {
        wait_count(count, before);
        fence_proxy_async_global();  // the bulk adds below come after the count's acquire
      }
      __syncwarp();
#pragma unroll
      for (int wg = 0; wg < 2; ++wg) NamedBarrier::sync(kDqSyncThreads, kBarDqFull + wg);
      if (leader) {
#pragma unroll
        for (int wg = 0; wg < 2; ++wg) {
          if (before == 0) {
            bulk_store(accum + wg * kDqHalfFloats, ss.dq[wg], kDqHalfFloats * 4);
          } else {
            bulk_reduce_add(accum + wg * kDqHalfFloats, ss.dq[wg], kDqHalfFloats * 4);
          }
        }
        bulk_commit();
        bulk_wait_read();
      }
      __syncwarp();
      if (step + 1 < num_steps) {
#pragma unroll
        for (int wg = 0; wg < 2; ++wg) NamedBarrier::arrive(kDqSyncThreads, kBarDqEmpty + wg);
      }
      if (leader) {
        bulk_wait_complete();
        fence_proxy_async_global();  // the bulk writes come before the count's release
        increment_count(count);
      }
      __syncwarp();
    }
  }
};

// dQ = dq_accum * softmax_scale in Element (bf16 or fp16; [b, s_q, h, d], strides dq_stride_*):
// one CTA of 256 threads per (64-row block, head, sample); thread t reads the 32 values that
// consumer thread t added (Note [Ordered dQ accumulation]) and stores them at their fragment
// coordinates.
template <class Element>
__global__ void __launch_bounds__(kBwdMmaThreads, 1)
    attention_bwd_dq_store_kernel(CUTE_GRID_CONSTANT BackwardParams const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using T = BackwardTraits;
  const int m = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int t = threadIdx.x;
  typename T::MmaDq mma_dq;
  Tensor acc = partition_fragment_C(mma_dq, Shape<Int<kBwdStep>, Int<kHeadDim>>{});
  Tensor coord = mma_dq.get_thread_slice(t).partition_C(
      make_identity_tensor(Shape<Int<kBwdStep>, Int<kHeadDim>>{}));
  static_assert(decltype(size(acc))::value == 32, "32 dQ values a thread");
  const int64_t block = (static_cast<int64_t>(head) * p.batch + batch) * p.row_blocks + m;
  const float4 *src = reinterpret_cast<const float4 *>(p.dq_accum + block * 2 * kDqHalfFloats +
                                                       (t / 128) * kDqHalfFloats);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float4 x = src[i * 128 + t % 128];
    acc(4 * i) = x.x;
    acc(4 * i + 1) = x.y;
    acc(4 * i + 2) = x.z;
    acc(4 * i + 3) = x.w;
  }
  const int64_t base = batch * p.dq_stride_batch + static_cast<int64_t>(head) * kHeadDim;
  store_rows<Element>(acc, coord, p.softmax_scale, static_cast<uint16_t *>(p.dq) + base,
                      p.dq_stride_seq, m * kBwdStep, p.seqlen_q);
#endif
}

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_DQ_ACCUM_H_
