/*
 * Online softmax of the sm90 mask-exact FP8 attention forward, and the conversion of P to the
 * register operand of the P.V WGMMA. Numerics: Note [Mask-exact FP8 scaling] and Note [V scale in
 * the rescale] (exact_fp8/formats.py), as the Triton kernel implements them:
 *
 *   t = (Q8 . K8^T)[r, n] * k_scale[n],  s = t * row_scale[r]  (log2 units; row_scale =
 *       q_scale[r] * softmax_scale * log2(e) > 0, so max_n s = row_scale * max_n t exactly)
 *   m' = max(m, max_n s),  m_ref = (m' == -inf ? 0 : m'),  alpha = exp2(m - m_ref)
 *   p = exp2(t * row_scale - (m_ref - log2(P_SCALE)))   (one FFMA; P_SCALE * the softmax
 *       numerator, <= P_SCALE up to the FFMA's rounding)
 *   l = l * alpha + sum_n p
 * except in huge rows (|m| >= kHugeRow, where that FFMA's rounding error would grow past what the
 * output and E4M3 hold; OnlineSoftmax::step), which subtract the max in the score domain:
 * p = exp2((t - t_max) * row_scale + 8).
 *
 * Note [Row maxima from the scores' bits]
 * An FP8 tile's scores t are finite and none is masked (every row sees the whole tile). Read as
 * signed 32-bit integers, the bit patterns of non-negative floats order as the floats do and lie
 * above those of all negative floats (sign bit set: negative integers), whose patterns order
 * opposite to the floats. So the largest pattern of a set with a non-negative member is that of
 * its largest float, and the smallest pattern of a set of negative floats is that of its largest
 * float: both exact. The thread's maxima of a row come from the largest patterns; a negative
 * one says that all its scores of the row are negative. A row's max enters the softmax as m' =
 * max(m, row_scale * tile max): once the running max m is >= 0, scores that are all negative
 * leave m' = m whatever their max, so -inf serves for them, and the rest of the step (alpha,
 * the exponent's bias, the huge-row formulas) sees the values the exact maxima give. Only a row
 * with m < 0 (or -inf: no key seen yet) needs the max of negative scores; a warp that has such
 * a row takes the smallest patterns too (OnlineSoftmax::step). Either way each row gets the bits
 * of the fp32 maxima, so the path a warp takes, which its other rows decide, never shows in a
 * row's output. (A NaN score, from an inf or NaN input, makes its row's output NaN both ways.)
 *
 * Accumulator fragments here are those of a 64 x N F32 WGMMA (cute's CLayout_64xN): thread
 * (lane q = lane % 4) holds value v = c + 2 h + 4 j at row lane / 4 + 8 h (+ 16 warp) and column
 * 8 j + 2 q + c. Each thread thus owns two rows (h = 0, 1), each spread over the 4 lanes of a quad.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_SOFTMAX_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_SOFTMAX_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include <cute/tensor.hpp>

#include "kernel_traits.h"
#include "params.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

CUTLASS_DEVICE float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}

CUTLASS_DEVICE float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// 2^x on the MUFU unit, results below 2^-126 flushed to 0: such a p is below E4M3's and far
// below a row sum's resolution (l >= 1 once the row's max is seen), so nothing is lost.
CUTLASS_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The column-scaled scores of one consumer warpgroup (Note [Mask-exact FP8 scaling]):
//   t[r, n] = (Q8 . K8^T)[r, n] * k_scale[n],  -inf where a boundary tile's element-wise mask
//   hides (r, n) (params.h: keys past len_kv, the causal diagonal, a window's edges); and of the
//   thread's two rows row_scale[r] = q_scale[r] * softmax_scale * log2(e) > 0, which
//   OnlineSoftmax folds into its exponent (1 for rows past len_q: they are computed and never
//   stored).
struct ScoreScales {
  float row_scale[2];  // of the thread's two rows
  // The keys each row sees, [first_key, first_key + num_keys): one unsigned compare per score,
  // (unsigned)(key - first_key) < num_keys (num_keys 0 for a row past len_q).
  int first_key[2];
  uint32_t num_keys[2];

  template <class CoordS>
  CUTLASS_DEVICE ScoreScales(AttentionParams const &p, Sequence const &s, CoordS const &tScS,
                             int head, int q0) {
    const float *q_scale = p.q_scale + static_cast<int64_t>(head) * p.tokens_q + s.tok_q;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = q0 + get<0>(tScS(2 * h));
      const bool real = row < s.len_q;
      row_scale[h] = real ? q_scale[row] * p.scale_log2 : 1.0f;
      // int64: the window sides may be kUnbounded
      const int64_t first = max(static_cast<int64_t>(row) + s.diag - p.window_left, int64_t(0));
      const int64_t last = min(static_cast<int64_t>(row) + s.diag + p.window_right,
                               static_cast<int64_t>(s.len_kv) - 1);
      first_key[h] = static_cast<int>(first);
      num_keys[h] = real && last >= first ? static_cast<uint32_t>(last - first + 1) : 0u;
    }
  }

  // The K scales of the thread's 32 keys of a tile (keys 8 j + 2 q + {0, 1}, j = 0..15), from
  // k_scale: [128] fp32 in shared memory, key n at k_scale_slot(n) (0 past s_kv). Loaded before
  // the scores are waited for, so that the shared-memory latency hides behind the Q.K^T WGMMA.
  struct KeyScales {
    float2 pair[16];
  };
  // The 16-byte word of groups j = 2 J, 2 J + 1 (k_scale_slot; get<1>(tScS(0)) = 2 q).
  template <class CoordS>
  CUTLASS_DEVICE static float4 scale_word(CoordS const &tScS, float const *k_scale, int J) {
    return *reinterpret_cast<float4 const *>(k_scale + 16 * J + 2 * get<1>(tScS(0)));
  }
  template <class CoordS>
  CUTLASS_DEVICE static void load(KeyScales &ks, CoordS const &tScS, float const *k_scale) {
#pragma unroll
    for (int J = 0; J < 8; ++J) {
      const float4 w = scale_word(tScS, k_scale, J);
      ks.pair[2 * J] = make_float2(w.x, w.y);
      ks.pair[2 * J + 1] = make_float2(w.z, w.w);
    }
  }

  // tSrS: the raw scores of an FP8 tile -> t, each K scale read from k_scale ([128] fp32 in
  // shared memory) as it is applied: a 256-key visit holds S of two tiles and has no registers
  // left to load the scales ahead.
  template <class FragS, class CoordS>
  CUTLASS_DEVICE static void apply_fp8(FragS &tSrS, CoordS const &tScS, float const *k_scale) {
#pragma unroll
    for (int J = 0; J < 8; ++J) {
      const float4 w = scale_word(tScS, k_scale, J);
      const float ks[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) tSrS(8 * J + i) *= ks[(i & 1) + 2 * (i >> 2)];
    }
  }

  // tSrS: the raw scores of KV tile kt -> t, with the element-wise mask if kBoundary.
  template <bool kBoundary, class FragS, class CoordS>
  CUTLASS_DEVICE void apply(FragS &tSrS, CoordS const &tScS, KeyScales const &k_scales,
                            int kt) const {
    const int key0 = kt * kKVTile;
#pragma unroll
    for (int j = 0; j < 16; ++j) {  // values 4 j + {0, 1} (row h = 0) and + {2, 3} (h = 1)
      const float2 ks = k_scales.pair[j];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int v = 4 * j + i, h = i >> 1;
        float t = tSrS(v) * ((i & 1) ? ks.y : ks.x);
        if constexpr (kBoundary) {
          const int key = key0 + get<1>(tScS(v));
          const bool seen = static_cast<uint32_t>(key - first_key[h]) < num_keys[h];
          t = seen ? t : -INFINITY;  // a select: NaN scores of hidden keys never pass
        }
        tSrS(v) = t;
      }
    }
  }
};

// The number of values a thread holds of a score fragment: 64 of a 64 x 128 tile, 128 of a pair.
template <class Frag>
struct FragValues {
  static constexpr int value = decltype(size(std::declval<Frag &>()))::value;
};

// The S fragments of a 256-key visit (two FP8 tiles, kernel.h) read as one fragment of 128
// values: value v < 64 is value v of the first tile's, v >= 64 value v - 64 of the second's (the
// same row half (v >> 1) & 1). Its indices are compile-time constants once the loops unroll.
template <class FragA, class FragB>
struct FragPair {
  static constexpr int kFirst = FragValues<FragA>::value;
  FragA &a;
  FragB &b;
  CUTLASS_DEVICE float &operator()(int v) const { return v < kFirst ? a(v) : b(v - kFirst); }
};
template <class FragA, class FragB>
struct FragValues<FragPair<FragA, FragB>> {
  static constexpr int value = FragValues<FragA>::value + FragValues<FragB>::value;
};

// A row whose running max m reaches this magnitude (log2 units) is a huge row: it subtracts its
// max in the score domain (OnlineSoftmax::step). Below it the one-FFMA exponent of the row's
// largest score is 8 + e with |e| <= ulp(m) <= 2^-8: p_max = 256 * 2^e rounds to 256 in E4M3
// and the row sum it enters is off by <= 0.27 %, under one bf16 ulp of the output.
constexpr float kHugeRow = 65536.0f;  // 2^16

CUTLASS_DEVICE bool is_huge_row(float m) { return fabsf(m) >= kHugeRow && m != -INFINITY; }

// Row state of the online softmax for the two rows a thread owns.
struct OnlineSoftmax {
  float m[2];      // running max of s (log2 units); -inf until the row has seen a key
  float t_max[2];  // of a huge row: its running max of t (m = fl(row_scale * t_max))
  float l[2];      // this thread's share of the running sum of p (quad_sum gives the row's)
  bool warp_huge;  // a row of this warp was huge at the last tile (warp-uniform)

  CUTLASS_DEVICE void init() {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[h] = -INFINITY;
      t_max[h] = -INFINITY;
      l[h] = 0.0f;
    }
    warp_huge = false;
  }

  // t: the column-scaled scores of a 64 x 128 fragment, or of two (a 256-key visit, kernel.h;
  // 64 or 128 values, -inf where masked), overwritten
  // with p; row_scale: of the thread's two rows (ScoreScales). Returns alpha of each row.
  //
  // The one-FFMA exponent fma(t, row_scale, 8 - m_ref) gives the row's largest score 8 + e,
  // e from the roundings of m_ref = fl(row_scale * t_max) and of 8 - m_ref: |e| <= ulp(m_ref),
  // which grows with the row's magnitude: from |m_ref| ~ 2^20 P8 of the max is no longer 256, from
  // 2^23 it may saturate, beyond ~2^31 exp2 overflows (a NaN output). A huge row (is_huge_row(m))
  // takes its reference in the score domain instead, exact at the max: p = exp2(fma(t - t_max,
  // row_scale, 8)) <= 2^8; alpha is 2^(old reference - new reference) with the reference m_ref
  // or row_scale * t_max. t_max is kept for huge rows only: a row turns huge at a tile that
  // raised its max (or its first tile), whose own max then is t_max.
  // The decision is the row's own (it depends on the row's visible scores only, so a hidden
  // token never moves a row from one formula to the other); the code path is the warp's: the
  // general form gives a row that is not huge the bits of the one-FFMA form (t - 0 = t).
  // turn: the warpgroups' alternation of the exponent loops (ExpTurn, kernel.h); its wait()
  // comes right before a loop of exp2 and its pass() after, on the loop's sums.
  // The warp's path is decided on the thread's own maxima, not the quad's: a row of the warp
  // can turn huge at this tile only if some thread's own maximum is huge (|max| over the quad
  // is at most the largest |own max|, or all of them are -inf), or it was huge before.
  // kFp8Tile (an FP8 visit: no masked score): the row maxima come from the scores' bits (Note
  // [Row maxima from the scores' bits]) and their shuffles are issued before the warp's vote,
  // so that the two latencies overlap (in boundary visits ptxas then serialized the d = 64
  // kernels' WGMMAs, C7511). The same bits as the fp32 maxima give.
  template <bool kFp8Tile, class Frag, class Turn>
  CUTLASS_DEVICE void step(Frag &t, float const (&row_scale)[2], float (&alpha)[2], Turn &turn) {
    static_assert(FragValues<Frag>::value % 64 == 0, "64 x 128 F32 accumulator fragments");
    float own_max[2];   // of the thread's own scores of each row
    float tile_max[2];  // of each row's scores in the tile: the quad's maximum of own_max
    bool maybe_huge = warp_huge;
    if constexpr (kFp8Tile) {
      int top[2];  // the largest bit pattern of the thread's scores of each row
      own_bits_extreme<true>(t, top);
      bool negative = false;  // a row whose max is still negative, only negative scores here
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        negative |= top[h] < 0 && !(m[h] >= 0.0f);
        own_max[h] = top[h] >= 0 ? __int_as_float(top[h]) : -INFINITY;
        tile_max[h] = quad_max(own_max[h]);
        maybe_huge |= is_huge_row(own_max[h] * row_scale[h]);
      }
      if (__any_sync(0xffffffff, maybe_huge || negative)) {
        if (__any_sync(0xffffffff, negative)) {  // the exact maxima, negative ones included
          int bottom[2];
          own_bits_extreme<false>(t, bottom);
          maybe_huge = warp_huge;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            own_max[h] = __int_as_float(top[h] >= 0 ? top[h] : bottom[h]);
            tile_max[h] = quad_max(own_max[h]);
            maybe_huge |= is_huge_row(own_max[h] * row_scale[h]);
          }
        }
        if (__any_sync(0xffffffff, maybe_huge)) {
          general_step(t, row_scale, tile_max, alpha, turn);
          return;
        }
      }
    } else {
      own_float_max(t, own_max);
#pragma unroll
      for (int h = 0; h < 2; ++h) maybe_huge |= is_huge_row(own_max[h] * row_scale[h]);
      if (__any_sync(0xffffffff, maybe_huge)) {
#pragma unroll
        for (int h = 0; h < 2; ++h) tile_max[h] = quad_max(own_max[h]);
        general_step(t, row_scale, tile_max, alpha, turn);
        return;
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) tile_max[h] = quad_max(own_max[h]);
    }
    fast_step(t, row_scale, tile_max, alpha, turn);
  }

  // step() for a warp without a row that is, was or may turn huge: the one-FFMA exponent.
  template <class Frag, class Turn>
  CUTLASS_DEVICE void fast_step(Frag &t, float const (&row_scale)[2], float const (&tile_max)[2],
                                float (&alpha)[2], Turn &turn) {
    float bias[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(m[h], tile_max[h] * row_scale[h]);
      const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
      alpha[h] = fast_exp2(m[h] - m_ref);
      bias[h] = kLog2PScale - m_ref;
      m[h] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
    turn.wait(bias);
#pragma unroll
    for (int v = 0; v < FragValues<Frag>::value; ++v) {
      const int h = (v >> 1) & 1;
      t(v) = fast_exp2(fmaf(t(v), row_scale[h], bias[h]));
      sum[h] += t(v);
    }
    turn.pass(sum[0] + sum[1]);
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = l[h] * alpha[h] + sum[h];
  }

  // The maxima of the thread's own scores of each row, in fp32 (-inf where all are masked).
  template <class Frag>
  CUTLASS_DEVICE static void own_float_max(Frag const &t, float (&own_max)[2]) {
    // Four partial maxima per row: short dependency chains (max is exact in any order).
    float part[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < 4; ++i) part[h][i] = -INFINITY;
    }
#pragma unroll
    for (int v = 0; v < FragValues<Frag>::value; ++v) {
      const int h = (v >> 1) & 1;
      part[h][(v >> 2) & 3] = fmaxf(part[h][(v >> 2) & 3], t(v));
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      own_max[h] = fmaxf(fmaxf(part[h][0], part[h][1]), fmaxf(part[h][2], part[h][3]));
    }
  }

  // The largest (kTop) or smallest bit pattern, read as a signed integer, of the thread's scores
  // of each row of an FP8 tile (Note [Row maxima from the scores' bits]), by the three-input
  // integer maximum or minimum of sm_90 (VIMNMX3: two scores an instruction at FMNMX's rate of
  // one; benchmarks/attention/sm90_pipe_rates.cu): chains of 16 scores, two per row of a tile
  // (four of a 256-key visit's pair). The scores are read through an asm mov: with
  // __float_as_int ptxas serialized every WGMMA of the d = 128 kernels (C7514).
  template <bool kTop, class Frag>
  CUTLASS_DEVICE static void own_bits_extreme(Frag const &t, int (&bits)[2]) {
    auto pick3 = [](int a, int b, int c) {
      return kTop ? __vimax3_s32(a, b, c) : __vimin3_s32(a, b, c);
    };
    constexpr int kChains = FragValues<Frag>::value / 32;  // 2 (a tile) or 4 (a pair)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int chain[kChains];
#pragma unroll
      for (int c = 0; c < kChains; ++c) {
        int x[16];  // the row's values 4 j + 2 h + {0, 1}, j = c, c + kChains, ...
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const int v = 4 * (c + kChains * (i >> 1)) + 2 * h + (i & 1);
          asm volatile("mov.b32 %0, %1;" : "=r"(x[i]) : "f"(t(v)));
        }
        int r = pick3(x[0], x[1], x[2]);
#pragma unroll
        for (int i = 3; i + 1 < 16; i += 2) r = pick3(r, x[i], x[i + 1]);
        chain[c] = kTop ? max(r, x[15]) : min(r, x[15]);
      }
      int r = chain[0];
#pragma unroll
      for (int c = 1; c < kChains; ++c) r = kTop ? max(r, chain[c]) : min(r, chain[c]);
      bits[h] = r;
    }
  }

  // step() for a warp with a row that is, was or may turn huge.
  template <class Frag, class Turn>
  CUTLASS_DEVICE void general_step(Frag &t, float const (&row_scale)[2],
                                   float const (&tile_max)[2], float (&alpha)[2], Turn &turn) {
    float t_sub[2], bias[2];
    bool huge[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float rs = row_scale[h];
      const float m_new = fmaxf(m[h], tile_max[h] * rs);
      const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
      huge[h] = is_huge_row(m_new);
      const bool huge_prev = is_huge_row(m[h]);
      const float t_new = huge_prev ? fmaxf(t_max[h], tile_max[h]) : tile_max[h];
      t_sub[h] = huge[h] ? t_new : 0.0f;
      bias[h] = huge[h] ? kLog2PScale : kLog2PScale - m_ref;
      const float x = huge[h] ? (huge_prev ? (t_max[h] - t_new) * rs : fmaf(-rs, t_new, m[h]))
                              : (huge_prev ? fmaf(rs, t_max[h], -m_ref) : m[h] - m_ref);
      alpha[h] = fast_exp2(x);
      if (huge[h]) t_max[h] = t_new;
      m[h] = m_new;
    }
    warp_huge = __any_sync(0xffffffff, huge[0] || huge[1]);
    float sum[2] = {0.0f, 0.0f};
    turn.wait(bias);
#pragma unroll
    for (int v = 0; v < FragValues<Frag>::value; ++v) {
      const int h = (v >> 1) & 1;
      t(v) = fast_exp2(fmaf(t(v) - t_sub[h], row_scale[h], bias[h]));
      sum[h] += t(v);
    }
    turn.pass(sum[0] + sum[1]);
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = l[h] * alpha[h] + sum[h];
  }
};

// P (fp32, the 64 x 128 accumulator fragment of S) -> the E4M3 A operand of the P.V WGMMA
// (cute's ALayout_64x32 per 32 keys: word w of 4 E4M3 holds row half w & 1 and the operand's
// keys 32 (w >> 2) + 16 ((w >> 1) & 1) + 4 q + {0..3}).
//
// Lane q of a quad holds keys 8 j' + 2 q + {0, 1} (j' = 0..3) of each 32-key block, not the
// operand's 4 q + {0..3} and 16 + 4 q + {0..3}. V8^T is written in the matching key order
// (NVTE_EXACT_FP8_KEYS_SM90_PV: a 16-key group's column 4 q + i holds its key
// (2 q, 2 q + 1, 8 + 2 q, 9 + 2 q)[i]), so each thread packs its own values, in register order:
// no shuffles. The sum over the keys of P.V is the same sum, term for term.
template <class FragS, class FragA>
CUTLASS_DEVICE void p_to_fp8_operand(FragS const &p, FragA &a) {
  static_assert(decltype(size(p))::value == 64 && decltype(size(a))::value == 64, "P fragments");
  uint32_t *words = reinterpret_cast<uint32_t *>(raw_pointer_cast(a.data()));
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t pair[4];  // keys 8 j' + 2 q + {0, 1} of block kb, row half h
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int v = 2 * h + 4 * (4 * kb + jj);
        pair[jj] = __nv_cvt_float2_to_fp8x2(make_float2(p(v), p(v + 1)), __NV_SATFINITE, __NV_E4M3);
      }
      words[4 * kb + h] = pair[0] | (pair[1] << 16);      // the block's first 16-key group
      words[4 * kb + 2 + h] = pair[2] | (pair[3] << 16);  // its second
    }
  }
}

// Two fp32 values as one 32-bit word of two 16-bit values of Element (ElementTypes::Bf16 or
// ::Fp16; round to nearest), the first in the low half: an output pair or an operand word.
template <class Element>
CUTLASS_DEVICE uint32_t pack_16bit_pair(float a, float b) {
  if constexpr (std::is_same_v<Element, ElementTypes::Fp16>) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t const *>(&h);
  } else {
    static_assert(std::is_same_v<Element, ElementTypes::Bf16>, "bf16 or fp16");
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t const *>(&h);
  }
}

// P (fp32) -> the A operand of the boundary tiles' P.V WGMMA in the input dtype (bf16 or fp16,
// the fragment's element type; round to nearest). cute's ALayout_64x16 per 16 keys orders values
// as the accumulator does (value i of both is the same (row, key)).
template <class FragS, class FragA>
CUTLASS_DEVICE void p_to_16bit_operand(FragS const &p, FragA &a) {
  static_assert(decltype(size(p))::value == 64 && decltype(size(a))::value == 64, "P fragments");
  using Element = typename FragA::value_type;
#pragma unroll
  for (int v = 0; v < 64; ++v) a(v) = static_cast<Element>(p(v));
}

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_SOFTMAX_H_
