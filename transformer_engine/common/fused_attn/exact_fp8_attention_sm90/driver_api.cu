/*
 * The one CUDA driver function the sm90 forward calls: cuTensorMapEncodeTiled, which CuTe's
 * make_tma_copy uses to build each TMA descriptor (launcher.cu builds four per call).
 *
 * The module links no libcuda (it loads on machines without a driver). CUTLASS's own wrapper
 * therefore looks the function up through cudaGetDriverEntryPointByVersion on every call, a
 * host cost per descriptor that small attention calls feel. launcher.cu is compiled with
 * CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL, so CuTe calls the function by name, and this file
 * defines that name (hidden inside the module) as the driver's entry point, looked up once
 * (exact_fp8_driver.h).
 */
#include <cuda.h>

#include "../exact_fp8_driver.h"

extern "C" __attribute__((visibility("hidden"))) CUresult CUDAAPI cuTensorMapEncodeTiled(
    CUtensorMap *map, CUtensorMapDataType type, cuuint32_t rank, void *address,
    const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
    const cuuint32_t *element_strides, CUtensorMapInterleave interleave,
    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2_promotion,
    CUtensorMapFloatOOBfill oob_fill) {
  const auto fn = transformer_engine::exact_fp8::tensor_map_encoder();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return fn(map, type, rank, address, dims, strides, box, element_strides, interleave, swizzle,
            l2_promotion, oob_fill);
}
