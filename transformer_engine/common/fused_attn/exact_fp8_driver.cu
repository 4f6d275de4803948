/*
 * The lookup of cuTensorMapEncodeTiled (exact_fp8_driver.h).
 */
#include <cuda_runtime.h>

#include <atomic>

#include "exact_fp8_driver.h"

namespace transformer_engine {
namespace exact_fp8 {

EncodeTiled tensor_map_encoder() {
  static std::atomic<EncodeTiled> cached{nullptr};
  EncodeTiled fn = cached.load(std::memory_order_acquire);
  if (fn != nullptr) return fn;
  void *entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  fn = reinterpret_cast<EncodeTiled>(entry);
  cached.store(fn, std::memory_order_release);
  return fn;
}

}  // namespace exact_fp8
}  // namespace transformer_engine
