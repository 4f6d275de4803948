// Issue rates of the instructions the sm90 forward's softmax is made of, per SM sub-partition
// (benchmarks/results/attention_forward_sm90.md, 2026-12-05 23:40 UTC and 2026-12-06 11:20 UTC):
// MUFU.EX2 (f32, f16x2, bf16x2), the E4M3 and f16 pair conversions, FMNMX, FMUL, FFMA, HADD2, the
// two- and three-input integer maxima (IMNMX, VIMNMX3), alone and beside another warp's stream.
// 132 blocks (one per SM, all loaded alike) of 4 or 8 warps: warps 0-3 (one per sub-partition)
// run op a, warps 4-7 op b; each thread runs 16 independent chains of 512 steps.
// A role's rate is block 0's warps' instructions over their clock64() cycles.
//
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o pipes sm90_pipe_rates.cu && ./pipes
#include <cuda_runtime.h>

#include <cstdio>

enum Op {
  EX2, F2FP, FMNMX, FMUL, FFMA, NOP, EX2H2, EX2BF2, F2FPH, H2F, HADD2, IMNMX, VIMNMX3, kNumOps
};
const char *const kOpNames[kNumOps] = {"EX2 f32",   "F2FP e4m3x2", "FMNMX",      "FMUL",
                                       "FFMA",      "none",        "EX2 f16x2",  "EX2 bf16x2",
                                       "F2FP f16x2", "cvt f16->f32", "HADD2",
                                       "IMNMX",     "VIMNMX3"};
constexpr int kChains = 16;  // independent chains per thread
constexpr int kSteps = 512;

// One step of every chain: x holds fp32 chains, w 32-bit (f16x2 / bf16x2 / conversion) chains.
template <int kOp>
__device__ __forceinline__ void step(float (&x)[kChains], unsigned (&w)[kChains]) {
#pragma unroll
  for (int i = 0; i < kChains; ++i) {
    const int j = (i + 1) % kChains, k = (i + 3) % kChains;
    if constexpr (kOp == EX2) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(x[i]));
    if constexpr (kOp == FMNMX) asm volatile("max.f32 %0, %0, %1;" : "+f"(x[i]) : "f"(x[j]));
    if constexpr (kOp == FMUL) asm volatile("mul.f32 %0, %0, %1;" : "+f"(x[i]) : "f"(x[j]));
    if constexpr (kOp == FFMA) asm volatile("fma.rn.f32 %0, %0, %1, %1;" : "+f"(x[i]) : "f"(x[j]));
    if constexpr (kOp == EX2H2) asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(w[i]));
    if constexpr (kOp == EX2BF2) asm volatile("ex2.approx.ftz.bf16x2 %0, %0;" : "+r"(w[i]));
    if constexpr (kOp == IMNMX) asm volatile("max.s32 %0, %0, %1;" : "+r"(w[i]) : "r"(w[j]));
    if constexpr (kOp == VIMNMX3) {
      // the three-input integer maximum (a DPX instruction of sm_90): two new values a step
      w[i] = static_cast<unsigned>(__vimax3_s32(static_cast<int>(w[i]), static_cast<int>(w[j]),
                                                static_cast<int>(w[k])));
    }
    if constexpr (kOp == HADD2) asm volatile("add.rn.f16x2 %0, %0, %1;" : "+r"(w[i]) : "r"(w[j]));
    if constexpr (kOp == F2FPH) {
      unsigned r;
      asm volatile("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(x[i]), "f"(x[k]));
      w[i] += r;
      x[i] += 1.0f;
    }
    if constexpr (kOp == H2F) {
      float f;
      asm volatile("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo;}"
                   : "=f"(f)
                   : "r"(w[i]));
      x[i] += f;
    }
    if constexpr (kOp == F2FP) {
      unsigned short r;
      asm volatile("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(x[i]), "f"(x[k]));
      w[i] += r;
    }
  }
}

template <int kOp>
__device__ long long timed_steps(float (&x)[kChains], unsigned (&w)[kChains]) {
  const long long t0 = clock64();
  for (int s = 0; s < kSteps; ++s) step<kOp>(x, w);
  return clock64() - t0;
}

// The cycles of op's kSteps steps (0 for NOP), by a run-time op.
template <int kOp = 0>
__device__ long long run_op(int op, float (&x)[kChains], unsigned (&w)[kChains]) {
  if constexpr (kOp == kNumOps) {
    return 0;
  } else {
    if (op == kOp) return kOp == NOP ? 0 : timed_steps<kOp>(x, w);
    return run_op<kOp + 1>(op, x, w);
  }
}

// cycles: [gridDim.x, 32] per warp; sink: never written (keeps the chains' results live).
__global__ void probe(int op_a, int op_b, long long *cycles, float *sink) {
  float x[kChains];
  unsigned w[kChains];
  for (int i = 0; i < kChains; ++i) {  // distinct per chain and thread: no chain is merged
    x[i] = 0.5f + 1e-3f * (threadIdx.x + i);
    w[i] = 0x38003800u + ((threadIdx.x * kChains + i) & 0x3ff) * 0x10001u;
  }
  const int warp = threadIdx.x / 32;
  __syncthreads();
  const long long c = run_op(warp < 4 ? op_a : op_b, x, w);
  float s = 0;
  for (int i = 0; i < kChains; ++i) s += x[i] + w[i];
  if (s == 12345.f) sink[threadIdx.x] = s;
  if (threadIdx.x % 32 == 0) cycles[blockIdx.x * 32 + warp] = c;
}

int main() {
  constexpr int kBlocks = 132;
  long long *d_cycles;
  float *d_sink;
  cudaMalloc(&d_cycles, kBlocks * 32 * sizeof(long long));
  cudaMalloc(&d_sink, 1024 * sizeof(float));
  struct Case {
    int a, b, warps;
  } cases[] = {{EX2, NOP, 4},     {EX2, EX2, 8},     {F2FP, NOP, 4},   {F2FP, F2FP, 8},
               {FMNMX, NOP, 4},   {FMNMX, FMNMX, 8}, {FMUL, NOP, 4},   {FMUL, FMUL, 8},
               {FFMA, FFMA, 8},   {EX2, F2FP, 8},    {EX2, FMNMX, 8},  {EX2, FMUL, 8},
               {EX2, FFMA, 8},    {EX2H2, NOP, 4},   {EX2H2, EX2H2, 8}, {EX2BF2, NOP, 4},
               {F2FPH, NOP, 4},   {H2F, NOP, 4},     {HADD2, NOP, 4},  {EX2H2, F2FP, 8},
               {EX2H2, EX2, 8},   {EX2H2, F2FPH, 8}, {EX2, H2F, 8},
               {IMNMX, NOP, 4},   {IMNMX, IMNMX, 8}, {VIMNMX3, NOP, 4}, {VIMNMX3, VIMNMX3, 8},
               {EX2, VIMNMX3, 8}, {EX2, IMNMX, 8}};
  printf("| warp 0-3 op | warp 4-7 op | warps | cycles (a) | cycles (b) | a instr/clk/SMSP |"
         " b instr/clk/SMSP |\n|---|---|---|---|---|---|---|\n");
  for (const Case &c : cases) {
    for (int rep = 0; rep < 2; ++rep) probe<<<kBlocks, c.warps * 32>>>(c.a, c.b, d_cycles, d_sink);
    cudaDeviceSynchronize();
    long long h[32];
    cudaMemcpy(h, d_cycles, sizeof(h), cudaMemcpyDeviceToHost);
    double ca = 0, cb = 0;  // mean cycles of block 0's warps of each role
    for (int i = 0; i < 4; ++i) ca += h[i] / 4.0;
    for (int i = 4; i < c.warps; ++i) cb += h[i] / 4.0;
    const double n = double(kSteps) * kChains;
    const bool has_b = c.warps > 4 && c.b != NOP;
    printf("| %s | %s | %d | %.0f | %.0f | %.3f | %.3f |\n", kOpNames[c.a],
           c.warps > 4 ? kOpNames[c.b] : "-", c.warps, ca, cb, n / ca, has_b ? n / cb : 0.0);
  }
  printf("(instr/clk/SMSP: warp instructions per clock of one sub-partition's warp; one warp of"
         " each role per sub-partition)\n");
  return 0;
}
