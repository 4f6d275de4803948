/*
 * Tile shapes, shared-memory layouts and tiled MMAs of the sm90 mask-exact FP8 attention forward.
 *
 * One CTA per SM walks the 128-row query tiles of the (sample, head)s one at a time
 * (tile_scheduler.h): a producer warpgroup (its first warp issues the TMA loads and stages the K
 * scales; setmaxnreg gives its registers away) and two consumer warpgroups, 64 rows each. KV
 * tiles of 128 keys (= KV_TILE = V_CHUNK_CURRENT, the format's constants: Note [Mask-exact FP8
 * scaling]) stream through a kStages ring, K and V with their own barriers so that a tile's
 * Q.K^T starts before its V has arrived; the ring runs on from one query tile to the next.
 *
 * Shared memory (d = 128, 3 stages; d = 64 halves the tiles, Q8 and K8 rows of 64 bytes, SW64,
 * and has 4 stages: KernelTraits::kStages):
 *   Q8    [128 rows, 128 d] E4M3, K-major SW128                          16 KiB
 *   K8    [3 stages][128 keys, 128 d] E4M3, K-major SW128                  48 KiB
 *   V     [3 stages] 32 KiB each, either
 *           V8^T [128 d, 128 keys] E4M3, K-major SW128 (an FP8 tile), or
 *           V    [128 d, 128 keys] bf16, MN-major SW128 (a boundary tile)    96 KiB
 *   K scales [3 stages][128] fp32                                            1.5 KiB
 *   O rows [8 consumer warps][16 rows, 64 + 8] 16-bit: the epilogue's staging  18 KiB
 *   barriers: Q full / empty; per stage K full / empty, V full / empty and the
 *   tail V; the ring of work items                                          ~0
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_KERNEL_TRAITS_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_KERNEL_TRAITS_H_

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/bfloat16.h>
#include <cutlass/float8.h>
#include <cutlass/half.h>

#include <type_traits>

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

using namespace cute;

constexpr int kQTile = 128;    // formats.Q_TILE
constexpr int kKVTile = 128;   // formats.KV_TILE == formats.V_CHUNK_CURRENT
constexpr int kWarpgroups = 2;                          // consumer warpgroups (64 rows each)
constexpr int kMmaThreads = kWarpgroups * 128;          // threads of the tiled MMAs
constexpr int kThreads = kMmaThreads + 128;             // + the producer warpgroup (first)
constexpr int kConsumerArrivals = kMmaThreads;           // arrivals that release a stage
constexpr int kKFullArrivals = 1 + 32;  // the TMA issue (+ bytes) and the producer warp's K scales
constexpr float kLog2PScale = 8.0f;  // log2(formats.P_SCALE)
constexpr int kEpilogueRows = 16;       // rows of O a consumer warp holds (epilogue.h)
constexpr int kEpilogueCols = 64;       // columns of O staged at a time
constexpr int kEpiloguePitch = kEpilogueCols + 8;  // 16-bit elements a staged row takes

// Where a stage's K scale of key `key` (0..127) lies in SharedStorage::k_scale: in the order
// the consumer threads apply them. Thread lane q (= lane % 4) of a quad holds the keys
// 8 j + 2 q + {0, 1} of value group j (softmax.h); the four scales of groups j = 2 J and 2 J + 1
// share the 16-byte word 4 J + q, so that a thread reads them with one 16-byte load
// (ScoreScales::load, apply_fp8).
CUTLASS_HOST_DEVICE constexpr int k_scale_slot(int key) {
  return ((key / 16) * 4 + (key % 8) / 2) * 4 + ((key / 8) % 2) * 2 + key % 2;
}

// A published work item of the persistent forward (tile_scheduler.h): the item, or -1 at the
// end of the CTA's walk, and where the CTA's rings stand when its query tile starts.
struct TileEntry {
  int item;
  int first;          // the CTA's KV visits before the tile's (its visit i uses stage first + i)
  uint32_t q_parity;  // the parity of the tile's Q8 on bar_q (the CTA's Q8 loads before it)
  int pad;  // pads the entry to 16 bytes (the ring holds alignas(16) entries)
};

// The ring of published work items (tile_scheduler.h TileRing): entry n % 2 holds the CTA's
// n-th item.
struct TileRingStorage {
  static constexpr int kReaders = kMmaThreads + 32;  // the consumers and the tail warp
  alignas(16) TileEntry entry[2];
  int published;                 // entries the producer has published (its thread's only)
  alignas(8) uint64_t full[2];   // the producer wrote the entry
  alignas(8) uint64_t empty[2];  // every reader took it
};

// The element types of the kernels.
struct ElementTypes {
  using Fp8 = cutlass::float_e4m3_t;
  using Bf16 = cutlass::bfloat16_t;
  using Fp16 = cutlass::half_t;
};

// The forward's tiles for head dim kHeadDim_ (64 or 128: d bytes of an E4M3 row, one 128- or
// 64-byte swizzle atom wide; the 16-bit V of a boundary tile is one or two atoms of 64 d).
template <int kHeadDim_>
struct KernelTraits : ElementTypes {
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  // The KV ring's stages (a 256-key visit takes two). A fourth stage (~213 KiB of shared memory
  // at d = 128) ran 1.00-1.04x at d = 64 and 0.975-1.002x at d = 128 (H100, 2026-12-07,
  // benchmarks/results/attention_forward_sm90.md): a d = 64 visit is half as long, so the loads
  // have less time to land.
  static constexpr int kStages = kHeadDim == 64 ? 4 : 3;

  // setmaxnreg of the producer and the consumer warpgroups. The producer holds its sequence's
  // geometry (read from cu_seqlens: vector registers) and spills 16 bytes at 24 (8 at 40, since
  // it stores the K scales in the consumers' order, k_scale_slot). The consumers' 256-key
  // visits (kernel.h: S of two tiles and O) leave ptxas a few values to spill (tests/build
  // bounds them). At d = 128 they need every register they can get: 240 with the producer at
  // 24; at 232 / 40 ptxas spilled O around the S wait and the kernel ran 3 % slower (H100,
  // 2026-12-06). At d = 64 ptxas spills less at 232 / 40 than at 240 / 24 (88 / 308 bytes
  // against 160 / 364, nvcc 13.0). docs/attention_kernel_sm90.md, item 15.
  static constexpr int kProducerRegisters = kHeadDim == 128 ? 24 : 40;
  static constexpr int kConsumerRegisters = kHeadDim == 128 ? 240 : 232;
  // setmaxnreg moves registers within the CTA's launch allocation (ptxas gives the kernel
  // 65536 / kThreads registers a thread, rounded down to a multiple of 8: 168): the warpgroups'
  // new counts must fit it, or the consumers' allocation waits forever.
  static_assert((kProducerRegisters + kWarpgroups * kConsumerRegisters) * 128 <=
                    (65536 / kThreads) / 8 * 8 * kThreads,
                "setmaxnreg: producer + consumer registers exceed the CTA's launch allocation");

  using TileQK = Shape<Int<kQTile>, Int<kKVTile>, Int<kHeadDim>>;  // (M rows, N keys, K d)
  using TilePV = Shape<Int<kQTile>, Int<kHeadDim>, Int<kKVTile>>;  // (M rows, N d, K keys)
  using WarpgroupsM = Layout<Shape<Int<kWarpgroups>, _1, _1>>;     // 64 rows per warpgroup

  // S = Q8 . K8^T: both operands from shared memory, K-major.
  using MmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Fp8, Fp8, float, Shape<_64, Int<kKVTile>, Int<kHeadDim>>>(),
      WarpgroupsM{}));
  // O += P8 . V8: P8 from registers, V8^T K-major in shared memory (an FP8 tile).
  using MmaPV8 = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Fp8, Fp8, float, Shape<_64, Int<kHeadDim>, Int<kKVTile>>>(),
      WarpgroupsM{}));
  // O += P . V in the input dtype (Element: bf16 or fp16) of a boundary tile: P from registers,
  // V MN-major (d contiguous) in shared memory.
  template <class Element>
  using MmaPV16 = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kKVTile>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      WarpgroupsM{}));

  // [128, d] E4M3, K-major (d contiguous): Q8 (rows, d), K8 (keys, d); rows of d bytes.
  using AtomRows = std::conditional_t<kHeadDim == 128, GMMA::Layout_K_SW128_Atom<Fp8>,
                                      GMMA::Layout_K_SW64_Atom<Fp8>>;
  using SmemLayoutRows = decltype(tile_to_shape(AtomRows{}, Shape<Int<128>, Int<kHeadDim>>{}));
  // [d, 128 keys] E4M3, K-major (keys contiguous): V8^T.
  using SmemLayoutVt =
      decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{}, Shape<Int<kHeadDim>, Int<128>>{}));
  // [d, 128 keys] bf16, MN-major (d contiguous): V of a boundary tile. The 64 x 8 atoms are
  // stacked along the keys first, so one TMA box is [64 d, 128 keys] (d / 64 per tile).
  using SmemLayoutV16 = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Bf16>{},
                                               Shape<Int<kHeadDim>, Int<128>>{}, Step<_2, _1>{}));

  static constexpr int kFp8TileBytes = 128 * kHeadDim;      // one Q8, K8 or V8^T tile
  static constexpr int kV16TileBytes = 128 * kHeadDim * 2;  // one 16-bit V tile
  static_assert(cosize_v<SmemLayoutRows> == kFp8TileBytes, "E4M3 row tile layout");
  static_assert(cosize_v<SmemLayoutVt> == kFp8TileBytes, "V8^T tile layout");
  static_assert(cosize_v<SmemLayoutV16> * 2 == kV16TileBytes, "16-bit V tile layout");
  static_assert(kStages >= 2, "the ring overlaps the loads of the next tile");

  struct SharedStorage {
    alignas(1024) Fp8 q[kFp8TileBytes];
    alignas(1024) Fp8 k[kStages][kFp8TileBytes];
    alignas(1024) uint8_t v[kStages][kV16TileBytes];  // V8^T (first half) or 16-bit V
    // [128] fp32 per stage: the K8 tile's scales, key n at k_scale_slot(n)
    alignas(16) float k_scale[kStages][kKVTile];
    float v_scale[kStages];                            // per stage: the V chunk's scale (FP8 tile)
    alignas(8) uint64_t bar_q;                  // Q8 arrived (TMA transaction bytes)
    alignas(8) uint64_t bar_q_empty;            // every consumer thread is done with the Q8
    alignas(8) uint64_t bar_k_full[kStages];    // K8 of the stage arrived
    alignas(8) uint64_t bar_v_full[kStages];    // V8^T or V of the stage arrived
    alignas(8) uint64_t bar_k_empty[kStages];   // every consumer thread is done with the K8
    alignas(8) uint64_t bar_v_empty[kStages];   // every consumer thread is done with the V
    alignas(8) uint64_t bar_v_tail[kStages];    // a tail visit's V arrived (mainloop.h)
    TileRingStorage tiles;                      // the CTA's work items (tile_scheduler.h)
    alignas(8) float2 turn_slot[kMmaThreads];   // a consumer thread's slot (kernel.h ExpTurn)
    // [8 warps][16 rows, 64 + 8 cols] 16-bit: a consumer warp's rows of O, 64 columns at a time
    // (epilogue.h); the 16-byte pad puts the 8 rows of a stmatrix in different banks
    alignas(16) uint16_t o_rows[kMmaThreads / 32][kEpilogueRows * kEpiloguePitch];
  };

  // Byte offset in a SmemLayoutV16 tile (1024-byte aligned) of the 128-byte row that holds key
  // `key`'s d values 64 half .. 64 half + 63. The SW128 swizzle of TMA and WGMMA XORs bits
  // [4, 7) of the shared-memory byte address with bits [7, 10): it permutes the 16-byte chunks
  // of a row and never moves a byte to another row. cute applies it the same way, to the byte
  // address of a smem pointer (the atom's smem_ptr_flag), so the row is that of the unswizzled
  // layout (layout_b). Evaluating the composed layout itself would apply the swizzle to element
  // offsets, which moves rows (key 9 onto key 8's at 16 bits); tests/build checks the rows
  // against cute's swizzled pointer.
  CUTLASS_HOST_DEVICE static int v16_row_bytes(int key, int half) {
    return static_cast<int>(SmemLayoutV16{}.layout_b()(make_coord(64 * half, key))) * 2;
  }
};

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_KERNEL_TRAITS_H_
