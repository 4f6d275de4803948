// Host program (no GPU): the sm90 forward's KV tile ranges (mainloop.h, kv_tile_range) against
// the rule of masks.fp8_tile_map and of the masks, brute force over many shapes and the three
// masks (no mask, causal top-left, causal bottom-right). Prints "ok" and exits 0, or prints the
// first mismatches and exits 1. Run by tests/build/test_build_sm90_attention.py.
#include <cstdio>

#include "transformer_engine/common/fused_attn/exact_fp8_attention_sm90/mainloop.h"

using namespace transformer_engine::exact_fp8::sm90;

int main() {
  int bad = 0;
  const int lengths[] = {1, 5, 64, 127, 128, 129, 200, 255, 256, 300, 384, 640, 1000};
  for (int s_q : lengths) {
    for (int s_kv : lengths) {
      for (int mask = 0; mask < 3; ++mask) {  // the C API's causal: 0, 1 (top-left), 2
        AttentionParams p{};
        p.seqlen_q = s_q;
        p.seqlen_kv = s_kv;
        p.causal = mask != 0;
        p.causal_offset = mask == 2 ? s_kv - s_q : 0;
        const int num_q_tiles = (s_q + kQTile - 1) / kQTile;
        for (int qt = 0; qt < num_q_tiles; ++qt) {
          const int q0 = qt * kQTile;
          const int q_last = (qt + 1) * kQTile < s_q ? q0 + kQTile - 1 : s_q - 1;
          auto sees = [&](int i, int j) {
            return j < s_kv && (!p.causal || j <= i + p.causal_offset);
          };
          // tiles some real row sees (a prefix), and the complete tiles every real row sees
          int want_tiles = 0, want_fp8 = 0;
          for (int kt = 0; kt * kKVTile < s_kv; ++kt) {
            bool any = false, all = (kt + 1) * kKVTile <= s_kv;
            for (int i = q0; i <= q_last; ++i) {
              for (int j = kt * kKVTile; j < (kt + 1) * kKVTile; ++j) {
                any |= sees(i, j);
                all &= sees(i, j);
              }
            }
            if (any) want_tiles = kt + 1;
            if (all && want_fp8 == kt) want_fp8 = kt + 1;
          }
          const KVTileRange r = kv_tile_range(p, qt);
          if ((r.num_tiles != want_tiles || r.num_fp8 != want_fp8) && bad++ < 10) {
            std::printf("mismatch s_q %d s_kv %d mask %d tile %d: (%d, %d) vs (%d, %d)\n", s_q,
                        s_kv, mask, qt, r.num_tiles, r.num_fp8, want_tiles, want_fp8);
          }
        }
      }
    }
  }
  if (bad == 0) std::printf("ok\n");
  return bad == 0 ? 0 : 1;
}
