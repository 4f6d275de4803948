/*
 * The sm_90 asynchronous-copy primitives of the TMA V cast (exact_fp8_transposed_current_tma.cu):
 * mbarriers in shared memory, tensor-tile loads (cp.async.bulk.tensor) that complete on them, and
 * named barriers over a subset of a block's warps. Every function is a single PTX instruction (or
 * a loop around one); addresses are shared-window addresses (__cvta_generic_to_shared).
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_TMA_CUH_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_TMA_CUH_

#include <cuda.h>
#include <stdint.h>

namespace transformer_engine {
namespace exact_fp8 {
namespace tma {

__device__ __forceinline__ uint32_t smem_address(const void *ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

/* An mbarrier that completes a phase after `count` arrivals (and the bytes they expect). */
__device__ __forceinline__ void barrier_init(uint64_t *bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count)
               : "memory");
}

/* Makes initialized mbarriers visible to the other threads and to the copy engine (followed by a
 * block barrier). */
__device__ __forceinline__ void barrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* One arrival that also expects `bytes` more bytes of tensor copies before the phase completes
 * (release: this thread's earlier shared-memory writes are seen by the waiters). */
__device__ __forceinline__ void barrier_arrive_expect(uint64_t *bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void barrier_arrive(uint64_t *bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}

/* Waits until the phase of parity `parity` has completed (acquire). */
__device__ __forceinline__ void barrier_wait(uint64_t *bar, uint32_t parity) {
  const uint32_t addr = smem_address(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (done == 0);
}

/* Loads the box of a rank-4 tensor map at coordinates (c0 innermost .. c3) into `dst` (aligned as
 * the map's swizzle needs); its bytes complete on `bar`. */
__device__ __forceinline__ void load_box_4d(void *dst, const CUtensorMap *map, int c0, int c1,
                                            int c2, int c3, uint64_t *bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(smem_address(bar))
      : "memory");
}

/* Fetches a tensor map (a kernel parameter) ahead of its first use. */
__device__ __forceinline__ void prefetch_map(const CUtensorMap *map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

/* Block-level barrier `id` (1..15; 0 is __syncthreads) over `threads` threads (whole warps). */
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace tma
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_TMA_CUH_
