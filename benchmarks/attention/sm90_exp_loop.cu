// The sm90 forward's exponent loop on its own (benchmarks/results/attention_forward_sm90.md,
// 2026-12-06): MUFU.EX2's latency and how close the loop's form comes to the unit's rate (8
// cycles a warp instruction per sub-partition, sm90_pipe_rates.cu). One block of 4 warps (one per
// sub-partition) or 8 (two per sub-partition, both looping); cycles per 64 exp2 of a warp:
//   chain   64 dependent x <- exp2(x * a): one MUFU.EX2 latency (plus one FMUL) per step
//   loop    the kernel's form: p = exp2(fma(t, a, b)), two row sums interleaved (softmax.h)
//   exp     the same 64 exp2 without the sums
//
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o exp_loop sm90_exp_loop.cu && ./exp_loop
#include <cuda_runtime.h>

#include <cstdio>

enum Form { kChain, kLoop, kExp };

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <int kForm>
__global__ void probe(float *sink, long long *cycles, int iters, float a, float b) {
  float t[64];
#pragma unroll
  for (int v = 0; v < 64; ++v) t[v] = -0.001f * (threadIdx.x + v);
  float acc = 0.0f;
  __syncthreads();
  const long long c0 = clock64();
  for (int it = 0; it < iters; ++it) {
    if constexpr (kForm == kChain) {
      float x = t[it & 63];
#pragma unroll
      for (int v = 0; v < 64; ++v) x = exp2_approx(x * a);
      acc += x;
    } else {
      float sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int v = 0; v < 64; ++v) {
        const float p = exp2_approx(fmaf(t[v], a, b));
        if constexpr (kForm == kLoop) sum[(v >> 1) & 1] += p;
        t[v] = p - b;  // the next iteration's input
      }
      acc += sum[0] + sum[1];
    }
  }
  const long long c1 = clock64();
#pragma unroll
  for (int v = 0; v < 64; ++v) acc += t[v];
  sink[threadIdx.x] = acc;
  if (threadIdx.x % 32 == 0) cycles[threadIdx.x / 32] = c1 - c0;
}

template <int kForm>
void run(const char *name, int warps, float *sink, long long *d_cycles) {
  constexpr int kIters = 200;
  for (int rep = 0; rep < 2; ++rep) {
    probe<kForm><<<1, warps * 32>>>(sink, d_cycles, kIters, 0.999f, -1.0f);
  }
  cudaDeviceSynchronize();
  long long h[8];
  cudaMemcpy(h, d_cycles, warps * sizeof(long long), cudaMemcpyDeviceToHost);
  double mean = 0;
  for (int w = 0; w < warps; ++w) mean += double(h[w]) / warps;
  printf("| %s | %d | %.1f |\n", name, warps / 4, mean / kIters);
}

int main() {
  float *sink;
  long long *d_cycles;
  cudaMalloc(&sink, 256 * sizeof(float));
  cudaMalloc(&d_cycles, 8 * sizeof(long long));
  printf("| form | warps per sub-partition | cycles per 64 exp2 of a warp |\n|---|---|---|\n");
  for (int warps : {4, 8}) {
    run<kChain>("chain", warps, sink, d_cycles);
    run<kLoop>("loop", warps, sink, d_cycles);
    run<kExp>("exp", warps, sink, d_cycles);
  }
  const cudaError_t e = cudaGetLastError();
  printf("%s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
