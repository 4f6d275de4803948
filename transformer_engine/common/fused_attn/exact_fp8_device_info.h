/*
 * Properties of the current CUDA device that launches size their grids by, asked once per device.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_DEVICE_INFO_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_DEVICE_INFO_H_

#include <cuda_runtime.h>

#include <atomic>

namespace transformer_engine {
namespace exact_fp8 {

constexpr int kMaxCachedDevices = 64;  // devices whose properties are remembered

/* The current device's SMs (asked every time on a device past kMaxCachedDevices). */
inline cudaError_t current_device_sm_count(int *sms) {
  static std::atomic<int> counts[kMaxCachedDevices];
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const bool cached = device < kMaxCachedDevices;
  if (cached && (*sms = counts[device].load(std::memory_order_relaxed)) > 0) return cudaSuccess;
  err = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess && cached) counts[device].store(*sms, std::memory_order_relaxed);
  return err;
}

}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_DEVICE_INFO_H_
