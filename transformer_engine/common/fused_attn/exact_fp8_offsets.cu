/*
 * Offsets of a thd pack's sequences for the transposed V casts, computed on the device so that
 * the host never reads cu_seqlens back (no sync; CUDA graph capture): each sequence's first
 * chunk and, for the aligned layout, its first column of data_t. Both are prefix sums over the
 * sequences of their lengths rounded up; one block scans the sequences kThreads at a time.
 */
#include <cub/block/block_scan.cuh>

#include "exact_fp8_kernels.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace {

constexpr int kThreads = 256;

struct AddPairs {
  __device__ int2 operator()(int2 a, int2 b) const { return make_int2(a.x + b.x, a.y + b.y); }
};

/* (chunks, columns) of one sequence: ceil(len / chunk) and len rounded up to kSpanColumns. */
__device__ int2 rounded_length(const int32_t *cu_seqlens, int n, int chunk) {
  const int len = __ldg(cu_seqlens + n + 1) - __ldg(cu_seqlens + n);
  return make_int2((len + chunk - 1) / chunk,
                   (len + kSpanColumns - 1) / kSpanColumns * kSpanColumns);
}

__global__ void __launch_bounds__(kThreads)
    sequence_offsets_kernel(const int32_t *cu_seqlens, int num_seqs, int chunk, int32_t *cu_chunks,
                            int32_t *columns) {
  using Scan = cub::BlockScan<int2, kThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  if (threadIdx.x == 0) {
    cu_chunks[0] = 0;
    if (columns != nullptr) columns[0] = 0;
  }
  int2 carry = make_int2(0, 0);  // the sums over the sequences of the previous rounds
  for (int first = 0; first < num_seqs; first += kThreads) {
    const int n = first + static_cast<int>(threadIdx.x);
    int2 sums = n < num_seqs ? rounded_length(cu_seqlens, n, chunk) : make_int2(0, 0);
    int2 round_total;
    Scan(scan_storage).InclusiveScan(sums, sums, AddPairs(), round_total);
    if (n < num_seqs) {
      cu_chunks[n + 1] = carry.x + sums.x;
      if (columns != nullptr) columns[n + 1] = carry.y + sums.y;
    }
    carry = AddPairs()(carry, round_total);
    __syncthreads();  // scan_storage is reused by the next round
  }
}

}  // namespace

cudaError_t launch_sequence_offsets(const int32_t *cu_seqlens, int num_seqs, int chunk,
                                    int32_t *cu_chunks, int32_t *columns, cudaStream_t stream) {
  sequence_offsets_kernel<<<1, kThreads, 0, stream>>>(cu_seqlens, num_seqs, chunk, cu_chunks,
                                                      columns);
  return cudaGetLastError();
}

}  // namespace exact_fp8
}  // namespace transformer_engine
