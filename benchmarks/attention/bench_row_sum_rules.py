"""The softmax's row sum over the E4M3 P it multiplies (a design study) against rules v2's sum.

    python benchmarks/attention/bench_row_sum_rules.py --out DIR [--seqlens 1024,4096]

Runs on the CPU (fp64 emulation of the rules, no GPU and no kernel). Rules v2 normalize a row by
l = sum_n p[n], the softmax numerators before P is cast to E4M3 (Note [Mask-exact FP8 scaling]),
while the FP8 tiles multiply V by the cast P8. The study's rule: l sums exactly the weights the
row multiplies V with, P8 on its FP8 tiles and p on its boundary tiles (consistent
normalization). It is as exact as v2: P8 is a function of the row's own visible scores and the
fixed P_SCALE. For the sm90 kernel it would make the row sum a by-product of P.V (a column of
ones beside V8^T on the tensor cores) instead of 64 FADDs per warp and tile in the exponent loop,
which is 40 % of a warp's visit (`benchmarks/results/attention_forward_sm90.md`, 2026-12-05).

Accuracy, as the V and K scale studies measured (bench_v_scale_rules.py, bench_k_scale_rules.py):
causal bshd, b = 1, h = 2, d = 128, bf16 inputs of the families below, s in --seqlens; errors
against the fp64 attention of the unquantized inputs on the rows of bench_k_scale_rules'
query_rows. Both rule rows quantize Q, K, V and P as rules v2 do (the reference's fork-current
operands and its P cast) and differ only in l. The reference's single-pass softmax stands in for
the kernels' online one (the rules' numerics, not an accumulation order). Columns: RMSE, relative
Frobenius error, cosine. Writes DIR/row_sum_rules.md and .json.
"""

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench_k_scale_rules import (  # noqa: E402
    HEAD_DIM,
    HEADS,
    family_inputs,
    query_rows,
    rule_rows,
    study_main,
)

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.formats import (  # noqa: E402,E501
    KV_TILE,
    P_SCALE,
    Q_TILE,
    cast_to_e4m3,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import (  # noqa: E402,E501
    SeqLayout,
    fp8_tile_map,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.attention import (  # noqa: E402,E501
    QuantConfig,
    dequantized_operands,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (  # noqa: E402,E501
    error_metrics,
)

V_OFFSETS = {"v-offset-4": 4.0, "v-offset-16": 16.0}
FAMILIES = {
    "outliers-N(0,100)": "N(0,1), 0.1% of the entries of Q, K, V drawn from N(0, 10^2)",
    "outliers-x50": "N(0,1), 0.1% of the entries of Q, K, V multiplied by 50",
    "k-channels-x20": "N(0,1), four K channels multiplied by 20",
    "v-offset-4": "N(0,1), V ~ N(4, 1): every key adds the same sign",
    "v-offset-16": "N(0,1), V ~ N(16, 1)",
}
RULES = ("v2: l = sum p", "l = sum of the weights used")


def inputs(family: str, s: int, seed: int):
    """bf16 q, k, v [s, h, d] of `family` (the K scale study's families, or N(0, 1) with V
    shifted by a common offset)."""
    if family in V_OFFSETS:
        gen = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(s, HEADS, HEAD_DIM, generator=gen) for _ in range(3))
        return [x.bfloat16() for x in (q, k, v + V_OFFSETS[family])]
    return family_inputs(family, s, seed)


def causal_rows_both_rules(q, k, v, rows):
    """fp64 causal attention of `rows` over rules v2's operands, normalized by each rule's l:
    {rule: out [len(rows), h, d]}, and the fp64 attention of the unquantized inputs."""
    s = q.shape[0]
    layout = SeqLayout.dense(1, s)
    qd, kd, v8 = dequantized_operands("fork-current", q, k, v, layout, QuantConfig(), torch.float64)
    allowed = torch.arange(s).view(1, -1) <= torch.arange(s).view(-1, 1)
    fp8 = fp8_tile_map(allowed, s).repeat_interleave(Q_TILE, 0).repeat_interleave(KV_TILE, 1)
    fp8, allowed = fp8[:s, :s][rows], allowed[rows]
    scale = q.shape[-1] ** -0.5
    truth, outs = [], {rule: [] for rule in RULES}
    for head in range(q.shape[1]):
        exact = (q[rows, head].double() @ k[:, head].double().T) * scale
        truth.append(
            torch.softmax(exact.masked_fill(~allowed, float("-inf")), -1) @ v[:, head].double()
        )
        scores = ((qd[rows, head] @ kd[:, head].T) * scale).masked_fill(~allowed, float("-inf"))
        p = torch.exp(scores - scores.amax(-1, keepdim=True))
        p8 = cast_to_e4m3((p * P_SCALE).float()).double() / P_SCALE
        num = (
            torch.where(fp8, p8, 0.0) @ v8[:, head] + torch.where(fp8, 0.0, p) @ v[:, head].double()
        )
        sums = {
            RULES[0]: p.sum(-1, keepdim=True),
            RULES[1]: torch.where(fp8, p8, p).sum(-1, keepdim=True),
        }
        for rule in RULES:
            outs[rule].append(num / sums[rule])
    return {rule: torch.stack(o, dim=1) for rule, o in outs.items()}, torch.stack(truth, dim=1)


def study(seqlens):
    results = {}
    for family in FAMILIES:
        for s in seqlens:
            q, k, v = inputs(family, s, seed=s)
            rows = query_rows(s, torch.Generator().manual_seed(s))
            outs, truth = causal_rows_both_rules(q, k, v, rows)
            results[f"{family} {s}"] = {rule: error_metrics(o, truth) for rule, o in outs.items()}
    return results


def markdown(results) -> str:
    ratios = [r[RULES[1]]["rel_err"] / r[RULES[0]]["rel_err"] for r in results.values()]
    lines = rule_rows(results, RULES[0]) + [
        "",
        f"Error of the consistent sum over v2's: {min(ratios):.3f} .. {max(ratios):.3f}.",
    ]
    return "\n".join(lines) + "\n"


def main():
    return study_main(__doc__, "row_sum_rules", "1024,4096", study, markdown)


if __name__ == "__main__":
    sys.exit(main())
