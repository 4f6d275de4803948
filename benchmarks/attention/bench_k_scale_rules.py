"""A per-chunk K scale on FP8 tiles ("rules v3", a design study) against rules v2's per-token one.

    python benchmarks/attention/bench_k_scale_rules.py --out DIR [--seqlens 1024,4096,16384]

Runs on the CPU (fp64 emulation of the rules, no GPU and no kernel). Rules v2 quantize K with one
scale per (token, kv-head). The sm90 kernel pays for it on every score (a multiply by the key's
scale and the scales' loads: 22 % of the kernel's time at s = 8k, benchmarks/results/
attention_forward_sm90.md). The study's rule v3: on an FP8 tile K8 takes one scale per
(kv-head, 128-key chunk), amax over the chunk's keys and all d channels, as V does in rules v2;
boundary tiles keep the per-token K8. It is as exact as v2 for the same reason as V's chunk scale:
a query tile reads a KV tile as an FP8 tile only when each of its rows sees every key of the tile
(masks.fp8_tile_map), so no hidden key enters a scale that such a row uses; on the boundary tiles
nothing changes. The scale becomes a per-tile scalar of the scores, folded into the row scale.

Accuracy, as issue 19 measured v2 against v1 (bench_v_scale_rules.py): causal bshd, b = 1, h = 2,
d = 128, bf16 inputs of three families (FAMILIES), s in --seqlens; errors against the fp64
attention of the unquantized inputs on a fixed subset of query rows (the first 64, the last 128,
up to 512 random ones). Every rule row is fp64 attention over that rule's dequantized operands,
V in FP8 everywhere (v2's per-chunk scale) and P exact, as in the v2 study:
  upstream   one current scale over concat(Q, K, V) (upstream 2.20.2)
  v2         per-token Q and K
  v3         per-token Q; K per chunk on the FP8 tiles (keys before the row's query tile), per
             token on the row's own (diagonal) tile
  v3 all     per-token Q; K per chunk everywhere (the chunk rule's worst case)
Columns: RMSE, relative Frobenius error, cosine. Writes DIR/k_scale_rules.md and .json.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.formats import (  # noqa: E402,E501
    KV_TILE,
    V_CHUNK_CURRENT,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import (  # noqa: E402,E501
    SeqLayout,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.quantize import (  # noqa: E402,E501
    dequantize,
    expand_chunk_scales,
    per_chunk_cast_to_fp8,
    per_token_cast_to_fp8,
    upstream_current_cast_to_fp8,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (  # noqa: E402,E501
    error_metrics,
)

HEAD_DIM = 128
HEADS = 2
K_OUTLIER_CHANNELS = (3, 17, 64, 101)
FAMILIES = {
    "outliers-N(0,100)": "N(0,1), 0.1% of the entries of Q, K, V drawn from N(0, 10^2)",
    "outliers-x50": "N(0,1), 0.1% of the entries of Q, K, V multiplied by 50",
    "k-channels-x20": f"N(0,1), K channels {list(K_OUTLIER_CHANNELS)} multiplied by 20",
    "k-token-outliers-x100": "N(0,1), 0.1% of the K tokens (whole rows) multiplied by 100",
}
RULES = ("upstream", "v2", "v3", "v3 all")


def family_inputs(family: str, s: int, seed: int):
    """bf16 q, k, v [s, h, d] (token-major, CPU) of one input family."""
    gen = torch.Generator().manual_seed(seed)
    shape = (s, HEADS, HEAD_DIM)
    q, k, v = (torch.randn(*shape, generator=gen) for _ in range(3))
    if family == "k-channels-x20":
        k[..., list(K_OUTLIER_CHANNELS)] *= 20
        return [x.bfloat16() for x in (q, k, v)]
    if family == "k-token-outliers-x100":
        k[torch.rand(s, HEADS, generator=gen) < 1e-3] *= 100
        return [x.bfloat16() for x in (q, k, v)]
    out = []
    for x in (q, k, v):
        spikes = torch.rand(*shape, generator=gen) < 1e-3
        if family == "outliers-x50":
            x = torch.where(spikes, 50 * x, x)
        else:  # entries drawn from N(0, 10^2)
            x = torch.where(spikes, 10 * torch.randn(*shape, generator=gen), x)
        out.append(x.bfloat16())
    return out


def query_rows(s: int, gen: torch.Generator) -> torch.Tensor:
    """The first and last tiles' rows, and up to 512 random rows in between."""
    n_random = min(512, max(s - 192, 0))
    rand = torch.randperm(max(s - 192, 1), generator=gen)[:n_random] + 64
    rows = torch.cat(
        [torch.arange(min(64, s)), rand.sort().values, torch.arange(max(s - 128, 0), s)]
    )
    return rows.unique()


def causal_rows(q, k_fp8_tiles, k_boundary, v, rows):
    """fp64 causal attention of `rows`: scores from k_fp8_tiles for the keys before the row's
    query tile (the row's FP8 tiles), from k_boundary for the rest. [len(rows), h, d]."""
    qh = q[rows].double().transpose(0, 1)  # [h, r, d]
    scale = q.shape[-1] ** -0.5
    s_fp8 = qh @ k_fp8_tiles.double().permute(1, 2, 0) * scale  # [h, r, s]
    s_bnd = qh @ k_boundary.double().permute(1, 2, 0) * scale
    cols = torch.arange(k_boundary.shape[0]).view(1, 1, -1)
    tile_start = (rows // KV_TILE * KV_TILE).view(1, -1, 1)
    scores = torch.where(cols < tile_start, s_fp8, s_bnd)
    scores = scores.masked_fill(cols > rows.view(1, -1, 1), float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v.double().transpose(0, 1)).transpose(0, 1)


def rule_operands(rule: str, q, k, v):
    """(q, k on FP8 tiles, k on boundary tiles, v) of `rule`, dequantized to fp64."""
    if rule == "upstream":
        qd, kd, vd, s_inv = upstream_current_cast_to_fp8(q, k, v)
        qd, kd, vd = (dequantize(x, s_inv) for x in (qd, kd, vd))
        return qd, kd, kd, vd
    layout = SeqLayout.dense(1, q.shape[0])
    q8, qs = per_token_cast_to_fp8(q)
    k8, ks = per_token_cast_to_fp8(k)
    v8, vs, _ = per_chunk_cast_to_fp8(v, layout)
    qd = dequantize(q8, qs.unsqueeze(-1))
    k_token = dequantize(k8, ks.unsqueeze(-1))
    vd = dequantize(v8, expand_chunk_scales(vs, layout, V_CHUNK_CURRENT).unsqueeze(-1))
    if rule == "v2":
        return qd, k_token, k_token, vd
    kc8, kcs, _ = per_chunk_cast_to_fp8(k, layout)  # one scale per (128-key chunk, kv-head)
    k_chunk = dequantize(kc8, expand_chunk_scales(kcs, layout, V_CHUNK_CURRENT).unsqueeze(-1))
    if rule == "v3":
        return qd, k_chunk, k_token, vd
    return qd, k_chunk, k_chunk, vd


def study(seqlens):
    results = {}
    for family in FAMILIES:
        for s in seqlens:
            q, k, v = family_inputs(family, s, seed=s)
            rows = query_rows(s, torch.Generator().manual_seed(s))
            truth = causal_rows(q, k, k, v, rows)
            entries = {}
            for rule in RULES:
                qd, k_fp8_tiles, k_boundary, vd = rule_operands(rule, q, k, v)
                entries[rule] = error_metrics(
                    causal_rows(qd, k_fp8_tiles, k_boundary, vd, rows), truth
                )
            results[f"{family} {s}"] = entries
    return results


def rule_rows(results, base_rule: str) -> list:
    """The table of a rules study (results: {"family s": {rule: error_metrics}}): one row per
    (family, s, rule), with the rule's relative error over `base_rule`'s."""
    lines = [
        "| family | s | rule | RMSE | rel. Frobenius error | cosine | vs v2 |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, r in results.items():
        family, s = key.rsplit(" ", 1)
        for rule, m in r.items():
            lines.append(
                f"| {family} | {s} | {rule} | {m['rmse']:.3e} | {m['rel_err']:.3e} |"
                f" {m['cosine']:.6f} | {m['rel_err'] / r[base_rule]['rel_err']:.3f} |"
            )
    return lines


def study_main(doc: str, name: str, default_seqlens: str, study, markdown) -> int:
    """A rules study's command line: --out DIR [--seqlens 1024,...]; writes DIR/`name`.md (the
    table, also printed) and DIR/`name`.json (the results)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seqlens", default=default_seqlens, help="comma-separated lengths")
    args = parser.parse_args()
    results = study([int(x) for x in args.seqlens.split(",")])
    table = markdown(results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.md").write_text(table)
    (args.out / f"{name}.json").write_text(json.dumps(results, indent=2))
    print(table, end="")
    return 0


def markdown(results) -> str:
    worst = {
        rule: max(r[rule]["rel_err"] / r["v2"]["rel_err"] for r in results.values())
        for rule in RULES
    }
    above_upstream = [
        key for key, r in results.items() if r["v3"]["rel_err"] >= r["upstream"]["rel_err"]
    ]
    lines = rule_rows(results, "v2") + [
        "",
        f"Largest error ratio to v2 over all families and lengths: v3 {worst['v3']:.3f},"
        f" v3 all {worst['v3 all']:.3f}, upstream {worst['upstream']:.3f}.",
        "v3 below upstream's rule everywhere: "
        + ("yes" if not above_upstream else f"NO ({', '.join(above_upstream)})"),
    ]
    return "\n".join(lines) + "\n"


def main():
    return study_main(__doc__, "k_scale_rules", "1024,4096,16384", study, markdown)


if __name__ == "__main__":
    sys.exit(main())
