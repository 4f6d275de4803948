// Issue rates of the instructions the sm90 forward's softmax is made of, per SM sub-partition
// (benchmarks/results/attention_forward_sm90.md, 2026-12-05 23:40 UTC): MUFU.EX2 (f32, f16x2,
// bf16x2), the E4M3 and f16 pair conversions, FMNMX, FMUL, FFMA, HADD2, alone and beside another
// warp's stream. 132 blocks (one per SM) of 4 or 8 warps: warps 0-3 (one per sub-partition) run
// op a, warps 4-7 op b; each thread runs 16 independent chains of 512 steps, and a warp's rate
// is its instructions over its clock64() cycles.
//
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o pipes sm90_pipe_rates.cu && ./pipes
#include <cstdio>
#include <cuda_runtime.h>
#include <cuda_fp8.h>

enum Op { EX2 = 0, F2FP = 1, FMNMX = 2, FMUL = 3, FFMA = 4, NOP = 5, EX2H2 = 6, EX2BF2 = 7, F2FPH = 8, H2F = 9, HADD2 = 10 };
constexpr int kIndep = 16;   // independent chains per thread
constexpr int kIters = 512;

template <int op>
__device__ __forceinline__ void body(float (&x)[kIndep], unsigned (&w)[kIndep]) {
#pragma unroll
  for (int i = 0; i < kIndep; ++i) {
    if (op == EX2) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(x[i]));
    if (op == FMNMX) asm volatile("max.f32 %0, %0, %1;" : "+f"(x[i]) : "f"(x[(i + 1) % kIndep]));
    if (op == FMUL) asm volatile("mul.f32 %0, %0, %1;" : "+f"(x[i]) : "f"(x[(i + 1) % kIndep]));
    if (op == FFMA) asm volatile("fma.rn.f32 %0, %0, %1, %1;" : "+f"(x[i]) : "f"(x[(i + 1) % kIndep]));
    if (op == EX2H2) asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(w[i]));
    if (op == EX2BF2) asm volatile("ex2.approx.ftz.bf16x2 %0, %0;" : "+r"(w[i]));
    if (op == HADD2) asm volatile("add.rn.f16x2 %0, %0, %1;" : "+r"(w[i]) : "r"(w[(i + 1) % kIndep]));
    if (op == F2FPH) {  // f32 pair -> f16x2 (cvt.rn.f16x2.f32)
      unsigned r;
      asm volatile("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(x[i]), "f"(x[(i + 3) % kIndep]));
      w[i] += r;
      x[i] += 1.0f;
    }
    if (op == H2F) {  // f16 -> f32
      float f;
      asm volatile("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo;}" : "=f"(f) : "r"(w[i]));
      x[i] += f;
    }
    if (op == F2FP) {
      unsigned short r;
      asm volatile("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(x[i]), "f"(x[(i + 3) % kIndep]));
      w[i] += r;
    }
  }
}

template <int op>
__device__ long long run(float (&x)[kIndep], unsigned (&w)[kIndep]) {
  long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) body<op>(x, w);
  return clock64() - t0;
}

// roles: op of warp (warp % 4 == sub-partition; warp / 4 == slot)
__global__ void probe(int op_a, int op_b, long long *cycles, float *sink) {
  float x[kIndep];
  unsigned w[kIndep];
  for (int i = 0; i < kIndep; ++i) { x[i] = 0.5f + 1e-3f * (threadIdx.x + i); w[i] = 0x38003800u + ((threadIdx.x * 16 + i) & 0x3ff) * 0x10001u; }
  const int warp = threadIdx.x / 32;
  const int op = warp < 4 ? op_a : op_b;
  long long c = 0;
  __syncthreads();
  switch (op) {
    case EX2: c = run<EX2>(x, w); break;
    case F2FP: c = run<F2FP>(x, w); break;
    case FMNMX: c = run<FMNMX>(x, w); break;
    case FMUL: c = run<FMUL>(x, w); break;
    case FFMA: c = run<FFMA>(x, w); break;
    case EX2H2: c = run<EX2H2>(x, w); break;
    case EX2BF2: c = run<EX2BF2>(x, w); break;
    case F2FPH: c = run<F2FPH>(x, w); break;
    case H2F: c = run<H2F>(x, w); break;
    case HADD2: c = run<HADD2>(x, w); break;
    default: break;
  }
  float s = 0;
  for (int i = 0; i < kIndep; ++i) s += x[i] + w[i];
  if (s == 12345.f) sink[threadIdx.x] = s;
  if (threadIdx.x % 32 == 0) cycles[blockIdx.x * 32 + warp] = c;
}

int main() {
  long long *d_c; float *d_s;
  cudaMalloc(&d_c, 132 * 32 * sizeof(long long));
  cudaMalloc(&d_s, 1024 * sizeof(float));
  const char *names[] = {"EX2 f32", "F2FP e4m3x2", "FMNMX", "FMUL", "FFMA", "none", "EX2 f16x2", "EX2 bf16x2", "F2FP f16x2", "cvt f16->f32", "HADD2"};
  struct Case { int a, b, warps; } cases[] = {
      {EX2, NOP, 4}, {EX2, EX2, 8}, {F2FP, NOP, 4}, {F2FP, F2FP, 8}, {FMNMX, NOP, 4},
      {FMNMX, FMNMX, 8}, {FMUL, NOP, 4}, {FMUL, FMUL, 8}, {FFMA, FFMA, 8},
      {EX2, F2FP, 8}, {EX2, FMNMX, 8}, {EX2, FMUL, 8}, {EX2, FFMA, 8},
      {EX2H2, NOP, 4}, {EX2H2, EX2H2, 8}, {EX2BF2, NOP, 4}, {F2FPH, NOP, 4}, {H2F, NOP, 4},
      {HADD2, NOP, 4}, {EX2H2, F2FP, 8}, {EX2H2, EX2, 8}, {EX2H2, F2FPH, 8}, {EX2, H2F, 8}};
  printf("| warp 0-3 op | warp 4-7 op | warps | cycles (a) | cycles (b) | a instr/clk/SMSP | b instr/clk/SMSP |\n|---|---|---|---|---|---|---|\n");
  for (auto cs : cases) {
    for (int rep = 0; rep < 2; ++rep)
      probe<<<132, cs.warps * 32>>>(cs.a, cs.b, d_c, d_s);
    cudaDeviceSynchronize();
    long long h[32];
    cudaMemcpy(h, d_c, 32 * sizeof(long long), cudaMemcpyDeviceToHost);
    double ca = 0, cb = 0;
    for (int i = 0; i < 4; ++i) ca += h[i] / 4.0;
    for (int i = 4; i < cs.warps; ++i) cb += h[i] / 4.0;
    const double n = double(kIters) * kIndep;
    printf("| %s | %s | %d | %.0f | %.0f | %.3f | %.3f |\n", names[cs.a], cs.warps > 4 ? names[cs.b] : "-", cs.warps,
           ca, cb, n / ca, cs.warps > 4 && cs.b != NOP ? n / cb : 0.0);
  }
  printf("(instr/clk/SMSP: warp-instructions per clock of one sub-partition's warp; one warp of each role per SMSP)\n");
  return 0;
}
