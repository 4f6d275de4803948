// Access probe of the transposed V cast: the bandwidth that simplified kernels with the cast's
// memory pattern reach (bf16 V [t, h, 128] -> E4M3 V8^T [h, 128, t]), next to a device-to-device
// copy of the same V, in one run. Not the product's kernel: no chunk offsets, no NaN handling, one
// 128-token chunk per span; it bounds what the layout allows and compares work orders:
//  - "reg GxP": lane = 16 tokens x 8 channels, G token groups x P channel pieces per warp, no amax;
//  - "amax GxP": the same plus the chunk amax (warp shuffles, one block barrier) and its scale;
//  - head-fastest / span-fastest: the order of the (span, head) items over the grid;
//  - persistent N/SM: a grid of N blocks per SM walking the items; otherwise one block per item;
//  - stride t + k: the V8^T row stride (t, or the width of a thd pack's aligned layout);
//  - columns + k: every item's columns shifted by k (a thd pack's 16-aligned sequence starts).
// Build and run on an sm_90 GPU (timing: 16 launches rotating over >= 256 MiB of inputs, median of
// 10 repetitions, events around the launches):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a \
//     -o v_cast_access_probe benchmarks/quantize/v_cast_access_probe.cu && ./v_cast_access_probe
#include <cuda_runtime.h>
#include <cuda_fp8.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("err %s line %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)

constexpr int D = 128;

__device__ __forceinline__ uint16_t cvt2(float a, float b) {
  __nv_fp8x2_storage_t r = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  return r;
}
__device__ __forceinline__ float lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// contiguous cast: thread reads 32 bytes, writes 16
__global__ void cast_contig(const uint4 *__restrict__ in, uint4 *__restrict__ out, int64_t n16, float s) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n16; i += (int64_t)gridDim.x * blockDim.x) {
    uint4 a = in[2 * i], b = in[2 * i + 1];
    uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    uint32_t o[4];
    for (int k = 0; k < 4; ++k) {
      uint16_t p0 = cvt2(lo(w[2 * k]) * s, hi(w[2 * k]) * s);
      uint16_t p1 = cvt2(lo(w[2 * k + 1]) * s, hi(w[2 * k + 1]) * s);
      o[k] = p0 | (uint32_t(p1) << 16);
    }
    out[i] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

__global__ void fill_random(uint16_t *p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t x = (uint32_t)i * 2654435761u ^ seed; x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
    float f = ((x & 0xffff) / 65536.0f - 0.5f) * 6.0f;
    p[i] = __bfloat16_as_ushort(__float2bfloat16(f));
  }
}
__global__ void copy_kernel(const uint4 *__restrict__ in, uint4 *__restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) out[i] = in[i];
}

// A lane's 16 token rows (tokens tok0 .. + 15) of 8 channels (ch0 .. + 7) of one head.
__device__ __forceinline__ void load_lane(const uint16_t *__restrict__ v, int h, int head, int tok0,
                                          int ch0, uint32_t (&r)[16][4]) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    uint4 x = *reinterpret_cast<const uint4 *>(v + ((int64_t)(tok0 + j) * h + head) * D + ch0);
    r[j][0] = x.x; r[j][1] = x.y; r[j][2] = x.z; r[j][3] = x.w;
  }
}

// Those rows times s as E4M3, one 16-byte store per channel into V8^T rows of `ostride` bytes.
__device__ __forceinline__ void cast_store_lane(const uint32_t (&r)[16][4], float s,
                                                uint8_t *__restrict__ out, int ostride, int head,
                                                int tok0, int ch0) {
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    uint32_t o[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float f[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) { uint32_t w = r[4 * q + k][c / 2]; f[k] = (c % 2) ? hi(w) : lo(w); }
      o[q] = cvt2(f[0] * s, f[1] * s) | (uint32_t(cvt2(f[2] * s, f[3] * s)) << 16);
    }
    *reinterpret_cast<uint4 *>(out + ((int64_t)head * D + ch0 + c) * ostride + tok0) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

// Where a lane of the probe kernels works: a warp is GROUPS token groups of 16 tokens x
// (32 / GROUPS) pieces of 8 channels; ORDER 0: items head fastest, 1: span fastest.
template <int GROUPS, int ORDER>
struct ProbeLane {
  static constexpr int PIECES = 32 / GROUPS;  // 16-byte pieces per lane row group
  static constexpr int WTOK = GROUPS * 16;    // tokens of a warp unit
  static constexpr int WCH = PIECES * 8;      // channels of a warp unit
  static constexpr int TUNITS = 128 / WTOK;   // token units per span
  int warp, lane, span, head, tok0, ch0;
  __device__ ProbeLane(int item, int t, int h) {
    warp = threadIdx.x / 32;
    lane = threadIdx.x % 32;
    const int spans = t / 128;
    if (ORDER == 0) { span = item / h; head = item % h; } else { head = item / spans; span = item % spans; }
    tok0 = span * 128 + warp % TUNITS * WTOK + lane / PIECES * 16;
    ch0 = warp / TUNITS * WCH + lane % PIECES * 8;
  }
};

// Register-tile transposed cast. A warp: GROUPS token groups of 16 tokens x (32/GROUPS) pieces of 8 channels.
// A block: 4 warps covering one item = 128*SPANS tokens x 128 channels of one head... (SPANS spans per warp, looped)
// ORDER 0: head fastest; 1: span fastest. PERSIST: grid-stride over items.
template <int GROUPS, int ORDER>
__global__ void __launch_bounds__(128) vt_reg(const uint16_t *__restrict__ v, uint8_t *__restrict__ out, int t, int h,
                                              int items, float s) {
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const ProbeLane<GROUPS, ORDER> l(item, t, h);
    uint32_t r[16][4];
    load_lane(v, h, l.head, l.tok0, l.ch0, r);
    cast_store_lane(r, s, out, t, l.head, l.tok0, l.ch0);
  }
}


// The register cast with the chunk amax (chunk = the 128-token span, all channels): per lane,
// then the warp (shuffles), then the block's 4 warps (shared memory, one barrier per item).
template <int GROUPS, int ORDER>
__global__ void __launch_bounds__(128) vt_amax(const uint16_t *__restrict__ v, uint8_t *__restrict__ out,
                                               float *__restrict__ scales, int t, int h, int items, int ostride = 0,
                                               int oshift = 0) {
  if (ostride == 0) ostride = t;
  __shared__ float partial[2][4];
  int parity = 0;
  for (int item = blockIdx.x; item < items; item += gridDim.x, parity ^= 1) {
    const ProbeLane<GROUPS, ORDER> l(item, t, h);
    const int warp = l.warp, lane = l.lane, head = l.head, span = l.span, tok0 = l.tok0, ch0 = l.ch0;
    uint32_t r[16][4];
    load_lane(v, h, head, tok0, ch0, r);
    __nv_bfloat162 m = __float2bfloat162_rn(0.f);
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162 *>(&r[j][k]);
        m = __hmax2(m, __habs2(x));
      }
    float a = fmaxf(__bfloat162float(m.x), __bfloat162float(m.y));
#pragma unroll
    for (int o = 16; o > 0; o /= 2) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    if (lane == 0) partial[parity][warp] = a;
    __syncthreads();
    a = fmaxf(fmaxf(partial[parity][0], partial[parity][1]), fmaxf(partial[parity][2], partial[parity][3]));
    const float s = a > 0.f ? __fdiv_rn(448.f, a) : 1.f;
    if (threadIdx.x == 0) scales[(int64_t)head * (t / 128) + span] = __frcp_rn(s);
    cast_store_lane(r, s, out, ostride, head, tok0 + oshift, ch0);
  }
}

// Median microseconds per launch of launch(i), i rotating over `rot` inputs.
float time_it(void (*launch)(int), int rot, int reps = 10, int calls = 16) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int i = 0; i < calls; ++i) launch(i % rot);
  CK(cudaDeviceSynchronize());
  std::vector<float> ts;
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(a);
    for (int i = 0; i < calls; ++i) launch(i % rot);
    cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); ts.push_back(ms * 1000.f / calls);
  }
  CK(cudaGetLastError());
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

static int T, H, ROT;
static std::vector<void *> ins, outs, outs2;
static float *scl;
static int SMS;

int main(int argc, char **argv) {
  cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0)); SMS = prop.multiProcessorCount;
  int shapes[][2] = {{16384, 16}, {8192, 16}};
  printf("| t | h | pattern | us | GB/s | vs copy |\n|---|---|---|---|---|---|\n");
  int nshapes = argc > 1 ? 1 : (int)(sizeof(shapes) / sizeof(shapes[0]));
  if (argc > 1) shapes[0][0] = atoi(argv[1]);  // one shape: t tokens
  for (int si = 0; si < nshapes; ++si) { auto &sh = shapes[si];
    T = sh[0]; H = sh[1];
    size_t in_bytes = (size_t)T * H * D * 2;
    ROT = std::max<int>(2, (256 << 20) / in_bytes + 1);
    for (auto p : ins) cudaFree(p); for (auto p : outs) cudaFree(p); for (auto p : outs2) cudaFree(p);
    ins.assign(ROT, nullptr); outs.assign(ROT, nullptr); outs2.assign(ROT, nullptr);
    for (int i = 0; i < ROT; ++i) { CK(cudaMalloc(&ins[i], in_bytes)); CK(cudaMalloc(&outs[i], in_bytes / 2)); CK(cudaMalloc(&outs2[i], in_bytes)); fill_random<<<1024, 256>>>((uint16_t *)ins[i], in_bytes / 2, 1234u + i); }
    if (!scl) CK(cudaMalloc(&scl, 1 << 22));
    auto report = [&](const char *name, float us, double bytes, double copy_bw) {
      double bw = bytes / us / 1e3;
      printf("| %d | %d | %s | %.1f | %.0f | %.0f%% |\n", T, H, name, us, bw, copy_bw > 0 ? 100.0 * bw / copy_bw : 100.0);
      return bw;
    };
    float us = time_it([](int i) { cudaMemcpyAsync(outs2[i], ins[i], (size_t)T * H * D * 2, cudaMemcpyDeviceToDevice); }, ROT);
    double copy_bw = report("cudaMemcpy d2d", us, 2.0 * in_bytes, 0);
    us = time_it([](int i) { int64_t n = (int64_t)T * H * D * 2 / 16; copy_kernel<<<SMS * 16, 256>>>((const uint4 *)ins[i], (uint4 *)outs2[i], n); }, ROT);
    report("copy kernel", us, 2.0 * in_bytes, copy_bw);
    us = time_it([](int i) { int64_t n = (int64_t)T * H * D / 16; cast_contig<<<SMS * 16, 256>>>((const uint4 *)ins[i], (uint4 *)outs[i], n, 1.5f); }, ROT);
    report("contiguous cast", us, 1.5 * in_bytes, copy_bw);
#define VT(G, O, GRID, NAME) \
    us = time_it([](int i) { int items = T / 128 * H; vt_reg<G, O><<<GRID, 128>>>((const uint16_t *)ins[i], (uint8_t *)outs[i], T, H, items, 1.5f); }, ROT); \
    report(NAME, us, 1.5 * in_bytes, copy_bw);
    VT(4, 0, items, "reg 4x8 (64B rows) head-fastest")
    VT(4, 1, items, "reg 4x8 (64B rows) span-fastest")
    VT(8, 0, items, "reg 8x4 (128B rows) head-fastest")
    VT(8, 1, items, "reg 8x4 (128B rows) span-fastest")
    VT(8, 0, SMS * 8, "reg 8x4 head-fastest persistent 8/SM")
    VT(8, 1, SMS * 8, "reg 8x4 span-fastest persistent 8/SM")
    VT(4, 0, SMS * 8, "reg 4x8 head-fastest persistent 8/SM")
#define VA(G, O, GRID, NAME) \
    us = time_it([](int i) { int items = T / 128 * H; vt_amax<G, O><<<GRID, 128>>>((const uint16_t *)ins[i], (uint8_t *)outs[i], scl, T, H, items); }, ROT); \
    report(NAME, us, 1.5 * in_bytes, copy_bw);
    VA(4, 1, items, "amax 4x8 span-fastest")
    static int OS; 
#define VS(EXTRA, NAME) OS = T + EXTRA; \
    us = time_it([](int i) { int items = T / 128 * H; vt_amax<4, 1><<<items, 128>>>((const uint16_t *)ins[i], (uint8_t *)outs2[i], scl, T, H, items, OS); }, ROT); \
    report(NAME, us, 1.5 * in_bytes, copy_bw);
    VS(0, "amax 4x8 stride t (big buffer)")
    VS(352, "amax 4x8 stride t+352 (mod 128 = 96)")
    VS(384, "amax 4x8 stride t+384 (mod 128 = 0)")
    VS(368, "amax 4x8 stride t+368 (mod 128 = 112)")
    VS(320, "amax 4x8 stride t+320 (mod 128 = 64)")
    static int SH;
#define VC(SHIFT, NAME) OS = T + 384; SH = SHIFT; \
    us = time_it([](int i) { int items = T / 128 * H; vt_amax<4, 1><<<items, 128>>>((const uint16_t *)ins[i], (uint8_t *)outs2[i], scl, T, H, items, OS, SH); }, ROT); \
    report(NAME, us, 1.5 * in_bytes, copy_bw);
    VC(0, "amax 4x8 stride t+384, columns + 0")
    VC(16, "amax 4x8 stride t+384, columns + 16 (half sectors at item ends)")
    VC(32, "amax 4x8 stride t+384, columns + 32 (whole sectors)")
    VC(96, "amax 4x8 stride t+384, columns + 96")
    VA(8, 1, items, "amax 8x4 span-fastest")
    VA(4, 0, items, "amax 4x8 head-fastest")
    VA(4, 1, SMS * 8, "amax 4x8 span-fastest persistent 8/SM")
    VA(8, 1, SMS * 8, "amax 8x4 span-fastest persistent 8/SM")
    VA(4, 1, SMS * 4, "amax 4x8 span-fastest persistent 4/SM")
    VA(4, 1, SMS * 12, "amax 4x8 span-fastest persistent 12/SM")
  }
  return 0;
}
