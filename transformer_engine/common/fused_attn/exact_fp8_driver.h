/*
 * The CUDA driver's cuTensorMapEncodeTiled, looked up once through the runtime (the module links
 * no libcuda, so it loads on machines without a driver). Used by the sm90 attention forward
 * (exact_fp8_attention_sm90/driver_api.cu).
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_DRIVER_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_DRIVER_H_

#include <cuda.h>

namespace transformer_engine {
namespace exact_fp8 {

using EncodeTiled = decltype(&::cuTensorMapEncodeTiled);  // the driver's 12.0 signature

/* The driver's function (looked up on first use, again after a failed lookup); null when the
 * driver has none. */
EncodeTiled tensor_map_encoder();

}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_DRIVER_H_
