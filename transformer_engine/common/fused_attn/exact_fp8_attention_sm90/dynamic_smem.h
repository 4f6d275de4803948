/*
 * The dynamic shared memory attribute of the sm90 attention kernels, set once per (kernel,
 * device) rather than by a host call per launch, which small calls feel.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_DYNAMIC_SMEM_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_DYNAMIC_SMEM_H_

#include <cuda_runtime.h>

#include <atomic>

#include "../exact_fp8_device_info.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

// The kernels whose attribute is remembered, one slot each.
enum class SmemSlot { kForward, kForwardFp16, kForwardLeaky, kBackward, kBackwardFp16 };

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, smem) the first time `slot`'s kernel
// is launched on the current device (every time on a device past kMaxCachedDevices).
template <SmemSlot slot, typename Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, int smem) {
  static std::atomic<bool> done[kMaxCachedDevices];
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const bool cached = device < kMaxCachedDevices;
  if (cached && done[device].load(std::memory_order_acquire)) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err == cudaSuccess && cached) done[device].store(true, std::memory_order_release);
  return err;
}

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_DYNAMIC_SMEM_H_
