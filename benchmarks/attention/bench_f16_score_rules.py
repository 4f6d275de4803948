"""Scores in f16 on the sm90 kernel's FP8 tiles (a design study): accuracy against rules v2.

    python benchmarks/attention/bench_f16_score_rules.py --out DIR [--seqlens 1024,4096]

Runs on the CPU: an emulation of the kernel's arithmetic, value by value, no GPU and no kernel.
The study's variant ("f16 scores", docs/attention_kernel_sm90.md, item 16) takes S = Q8 . K8^T on
the FP8 tiles from the WGMMA with an F16 accumulator and runs the score arithmetic on f16 pairs
(mul/sub/fma.f16x2, ex2.approx.f16x2, f16 row sums), so that a warp issues fewer instructions a
score. What it changes, emulated here:
  - Q8 and K8 take the per-token rule with the E4M3 target 14 = 448 / 32 instead of 448, so that
    |Q8 . K8^T| <= 14 * 14 * 128 = 25088 fits f16 (the same E4M3 values but for entries below
    amax / 896, which fall into E4M3's subnormals);
  - S rounded to f16 after each 32-channel step of the accumulation (the WGMMA's k-steps);
  - the K scales as f16 ratios r = k_scale / K_c to the tile's largest K scale K_c (<= 1), K_c
    folded into the row's f32 scale; t = f16(S * r);
  - the exponent x = f16((t - t_max) * f16(row scale) + f16(8 + t_max * row scale - m)), one
    rounding of the fused form, p = f16(2^x), P8 = E4M3(p);
  - the row sums in f16, eight (a tile's) or sixteen (a 256-key visit's) values a lane, then
    added in f32.
The boundary (diagonal) tiles keep the fp32 path in both rows, as the kernel does. The "v2" row
emulates the kernel as it is: f32 scores, t = f32(S * k_scale), x = f32(fma(t, row scale, 8 -
m)), p = f32(2^x), f32 sums, P8 = E4M3(p). Both visit the FP8 tiles two at a time (256 keys: one
row maximum and one exponent pass per pair) and accumulate P8 . V8 exactly (the kernel's
two-level accumulation is not what is compared); v2's casts are the reference's. Causal bshd,
b = 1, h = 2, d = 128, bf16 inputs of the rules studies' families (bench_k_scale_rules) and three
more (OWN_FAMILIES); errors against the fp64 attention of the unquantized inputs over every row.
"vs v2": the relative Frobenius error over v2's. Writes DIR/f16_score_rules.md and .json.
"""

import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import bench_k_scale_rules as k_scale_study  # noqa: E402

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.formats import (  # noqa: E402,E501
    E4M3_MAX,
    KV_TILE,
    cast_to_e4m3,
    compute_scale_from_amax,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import (  # noqa: E402,E501
    SeqLayout,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.quantize import (  # noqa: E402,E501
    abs_ignoring_nan,
    expand_chunk_scales,
    per_chunk_cast_to_fp8,
    per_token_cast_to_fp8,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (  # noqa: E402,E501
    error_metrics,
)

HEAD_DIM = k_scale_study.HEAD_DIM
HEADS = k_scale_study.HEADS
F16_TARGET = 14.0  # 448 / 32: |Q8 . K8^T| <= 14 * 14 * 128 < 65504
LOG2E = 1.4426950408889634
# the rules studies' families (bench_k_scale_rules), and three more
OWN_FAMILIES = {
    "normal": "N(0, 1)",
    "sharp-q-x8": "N(0,1), Q multiplied by 8 (logits with a standard deviation of 8)",
    "v-mean-4": "Q, K ~ N(0,1), V ~ N(4, 1)",
}
FAMILIES = {**OWN_FAMILIES, **k_scale_study.FAMILIES}
VARIANTS = ("v2", "f16 scores")


def f32(x):
    return x.float().double()


def f16(x):
    return x.half().double()


def e4m3(x):
    return cast_to_e4m3(x.float()).double()


def family_inputs(family: str, s: int, seed: int):
    """bf16 q, k, v [s, h, d] (CPU) of one input family."""
    if family in k_scale_study.FAMILIES:
        return k_scale_study.family_inputs(family, s, seed)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(s, HEADS, HEAD_DIM, generator=gen) for _ in range(3))
    if family == "sharp-q-x8":
        q = q * 8
    elif family == "v-mean-4":
        v = v + 4
    elif family != "normal":
        raise ValueError(family)
    return [x.bfloat16() for x in (q, k, v)]


def per_token_cast_target_14(x):
    """Rules v2's per-token cast (reference per_token_cast_to_fp8) with the E4M3 target 14: the
    scale 448 / amax times 1/32, as the probes' Q and K casts. (data, scale_inv [s, h])."""
    scale = compute_scale_from_amax(abs_ignoring_nan(x).amax(dim=-1)) * (F16_TARGET / E4M3_MAX)
    return cast_to_e4m3(x.float() * scale.unsqueeze(-1)), 1.0 / scale


def f16_accumulate(q8, k8):
    """S = q8 . k8^T [h, r, n], rounded to f16 after each 32-channel step."""
    acc = None
    for c in range(0, HEAD_DIM, 32):
        part = q8[..., c : c + 32] @ k8[..., c : c + 32].transpose(-1, -2)
        acc = f16(part if acc is None else acc + part)
    return acc


def lane_sums_f16(p, group: int):
    """Row sums of p [h, r, n] as the kernel's f16 lanes take them: lane (quad thread, word
    half, word parity) sums `group` values in f16 in key order, the lanes are added in f32."""
    h, r, n = p.shape
    # key = 8 j + 2 q + c (per 128-key tile); lane = (q, c, j & 1), j runs over the visit's tiles
    tiles = n // KV_TILE
    x = p.view(h, r, tiles, 8, 2, 4, 2)  # [.., tile, j // 2, j & 1, q, c]
    x = x.permute(0, 1, 4, 5, 6, 2, 3).reshape(h, r, 16, tiles * 8)  # lanes, their values
    acc = torch.zeros(h, r, 16, dtype=torch.float64)
    for i in range(x.shape[-1]):
        acc = f16(acc + x[..., i])
    assert x.shape[-1] == group
    return f32(acc).sum(-1)


def emulate(variant: str, q, k, v):
    """The kernel's output [s, h, d] (fp64) under `variant`."""
    s = q.shape[0]
    cast = per_token_cast_target_14 if variant == "f16 scores" else per_token_cast_to_fp8
    q8, qs = (x.double() for x in cast(q))
    k8, ks = (x.double() for x in cast(k))
    layout = SeqLayout.dense(1, s)
    v8, vs, _ = per_chunk_cast_to_fp8(v, layout)
    vs = expand_chunk_scales(vs, layout, KV_TILE).double()  # [s, h]
    vd = (v8.double() * vs.unsqueeze(-1)).transpose(0, 1)  # [h, s, d] dequantized FP8 V
    v16 = v.double().transpose(0, 1)
    q8, k8 = q8.transpose(0, 1), k8.transpose(0, 1)  # [h, s, d]
    ks = ks.transpose(0, 1)  # [h, s]
    row_scale_all = f32(qs.transpose(0, 1) * (HEAD_DIM**-0.5) * LOG2E)  # [h, s]
    out = torch.empty(HEADS, s, HEAD_DIM, dtype=torch.float64)
    for i in range(s // KV_TILE):
        rows = slice(i * KV_TILE, (i + 1) * KV_TILE)
        rs = row_scale_all[:, rows].unsqueeze(-1)  # [h, r, 1]
        m = torch.full((HEADS, KV_TILE, 1), -math.inf, dtype=torch.float64)
        l = torch.zeros_like(m)
        o = torch.zeros(HEADS, KV_TILE, HEAD_DIM, dtype=torch.float64)
        # the diagonal (boundary) tile first: fp32 path, element-wise mask, bf16 P and V
        keys = slice(i * KV_TILE, (i + 1) * KV_TILE)
        t = f32(f32(q8[:, rows] @ k8[:, keys].transpose(-1, -2)) * ks[:, keys].unsqueeze(1))
        hidden = torch.ones(KV_TILE, KV_TILE, dtype=torch.bool).triu(1)
        t = t.masked_fill(hidden, -math.inf)
        m, l, o = fp32_step(t, rs, m, l, o, v16[:, keys], p_round=lambda p: p.bfloat16().double())
        # the FP8 tiles two at a time
        for j0 in range(0, i, 2):
            js = list(range(j0, min(j0 + 2, i)))
            keys = slice(js[0] * KV_TILE, (js[-1] + 1) * KV_TILE)
            if variant == "v2":
                t = f32(f32(q8[:, rows] @ k8[:, keys].transpose(-1, -2)) * ks[:, keys].unsqueeze(1))
                m, l, o = fp32_step(t, rs, m, l, o, vd[:, keys], p_round=e4m3)
            else:
                m, l, o = f16_step(q8[:, rows], k8[:, keys], ks[:, keys], rs, m, l, o, vd[:, keys])
        out[:, rows] = o / l
    return out.transpose(0, 1)


def fp32_step(t, rs, m, l, o, v, p_round):
    """One visit of the fp32 path (softmax.h fast_step): t [h, r, n] fp32 scores."""
    m_new = torch.maximum(m, f32(t.amax(-1, keepdim=True) * rs))
    m_ref = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
    alpha = f32(torch.exp2(m - m_ref))
    p = f32(torch.exp2(f32(t * rs + f32(8.0 - m_ref))))  # fma: one rounding
    p = torch.nan_to_num(p, nan=0.0)
    l = f32(l * alpha + p.sum(-1, keepdim=True))
    return m_new, l, o * alpha + p_round(p) @ v


def f16_step(q8, k8, ks, rs, m, l, o, v):
    """One 256-key (or 128-key) visit of the f16 path on FP8 tiles (no masked score)."""
    s_h = f16_accumulate(q8, k8)  # [h, r, n]
    n = s_h.shape[-1]
    kc = ks.view(HEADS, n // KV_TILE, KV_TILE).amax(-1)  # [h, tiles]: each tile's K_c
    r = f16(ks / kc.repeat_interleave(KV_TILE, -1))  # <= 1
    t = f16(s_h * r.unsqueeze(1))
    # the row scale with each tile's K_c: t's units differ per tile, so the emulation (like the
    # kernel would) takes the max over the tiles of t * rs_tile in f32
    rs_tile = f32(rs * kc.repeat_interleave(KV_TILE, -1).unsqueeze(1))  # [h, r, n]
    tile_max = torch.stack(
        [t[..., c * KV_TILE : (c + 1) * KV_TILE].amax(-1) for c in range(n // KV_TILE)], -1
    )  # [h, r, tiles]
    scaled_max = f32(tile_max * rs_tile[..., ::KV_TILE])
    m_new = torch.maximum(m, scaled_max.amax(-1, keepdim=True))
    m_ref = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
    alpha = f32(torch.exp2(m - m_ref))
    t_ref = tile_max.repeat_interleave(KV_TILE, -1)
    corr = f16(f32(8.0 + (t_ref * rs_tile - m_ref)))
    x = f16(f16(t - t_ref) * f16(rs_tile) + corr)  # fma.f16x2: one rounding
    p = f16(torch.exp2(x))
    sums = lane_sums_f16(p, group=8 * (n // KV_TILE))
    l = f32(l * alpha + sums.unsqueeze(-1))
    return m_new, l, o * alpha + e4m3(p) @ v


def reference(q, k, v, rows: int = 1024):
    """fp64 causal attention of the unquantized inputs [s, h, d] (k_scale_study.causal_rows,
    in blocks of rows)."""
    s = q.shape[0]
    blocks = [torch.arange(r, min(r + rows, s)) for r in range(0, s, rows)]
    return torch.cat([k_scale_study.causal_rows(q, k, k, v, b) for b in blocks])


def study(seqlens):
    """{"family s": {variant: error_metrics}}, as the rules studies' tables take them."""
    results = {}
    for s in seqlens:
        for fi, family in enumerate(FAMILIES):
            q, k, v = family_inputs(family, s, seed=1000 * fi + s)
            ref = reference(q, k, v)
            results[f"{family} {s}"] = {
                variant: error_metrics(emulate(variant, q, k, v), ref) for variant in VARIANTS
            }
            print(family, s, results[f"{family} {s}"], flush=True)
    return results


def markdown(results) -> str:
    ratios = [r["f16 scores"]["rel_err"] / r["v2"]["rel_err"] for r in results.values()]
    lines = k_scale_study.rule_rows(results, "v2") + [
        "",
        f"Error ratio of f16 scores to v2 over all families and lengths: {min(ratios):.3f} to"
        f" {max(ratios):.3f}.",
    ]
    return "\n".join(lines) + "\n"


def main():
    return k_scale_study.study_main(__doc__, "f16_score_rules", "1024,4096", study, markdown)


if __name__ == "__main__":
    sys.exit(main())
