"""Accuracy of FP8 operands in the backward, emulated in fp64: which products can leave bf16.

    python benchmarks/attention/bench_backward_fp8_rules.py --out DIR [--seqlens 1024 2048]

Runs on the CPU (fp64). Causal attention, b = 1, h = 2, d = 128, bf16 inputs of three input
families of the forward's rules studies (FAMILIES, from bench_k_scale_rules.family_inputs) and
dO ~ N(0, 1). The forward
is the fork's (reference_attention, current scaling): its O enters D = rowsum(dO * O), its
quantized Q and K the scores; every rule below keeps those, so the rules differ only in the
operands of the backward's products (the kernels accumulate in fp32; fp64 here):

  bf16 (the kernels today)  dP = dO . V^T on bf16 operands; P, dS, Q_dq, K_dq rounded to bf16 for
                            dV = P^T . dO, dK = dS^T . Q_dq, dQ = dS . K_dq
  dP in FP8                 dO and V cast per token (E4M3, each token's amax over d, the rule of
                            Q and K): dP = (dO8 . V8^T) * s_dO[row] * s_V[key]
  dP, dV in FP8             and dV = sum over 64-row blocks of c[key] * (P~8^T . dO8), where
                            P~ = P * s_dO[row] is cast per (key, block) (c: its amax / 448)
  all in FP8 (dS E4M3)      and dK from dS~ = dS * s_Q[row] cast per (key, 64-row block) against
                            Q8, dQ from dS * s_K[key] cast per (row, 64-key block) against K8
  all in FP8 (dS E5M2)      the same with dS~ in E5M2
  dV, dK, dQ in FP8, dP bf16  the gradient products in FP8 (dS~ E4M3), dP on bf16 operands

Every scale above comes from one token's values (s_dO, s_V, s_Q, s_K) or from one tile's visible
entries (the per-block casts of P~ and dS~ see only positions the mask lets through, which are the
only nonzero ones), so each rule keeps the backward's invariant (DESIGN.md section 2) by the same
argument as the scores' per-token rule, provided a token whose dO is all zeros gets dO scale 0
(rule_gradients; tests/cpu/reference/test_backward_fp8_study.py checks it bit for bit, and that
scale 1 leaks). Errors of dq, dk, dv against the exact fp64 gradients of the unquantized bf16
inputs: relative Frobenius error and cosine.

Writes DIR/backward_fp8_rules.md and DIR/backward_fp8_rules.json and prints the table.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_k_scale_rules import family_inputs  # noqa: E402

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.attention import (  # noqa: E402,E501
    reference_attention,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.quantize import (  # noqa: E402,E501
    per_token_cast_to_fp8,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (  # noqa: E402,E501
    cosine_similarity,
    rel_frobenius_error,
)

HEAD_DIM = 128
BLOCK = 64  # rows of a dK/dV step, keys of a dQ step
E4M3_MAX, E5M2_MAX = 448.0, 57344.0
FAMILIES = ("outliers-N(0,100)", "outliers-x50", "k-channels-x20")
E4M3 = (E4M3_MAX, torch.float8_e4m3fn)
E5M2 = (E5M2_MAX, torch.float8_e5m2)
# name: (dP in FP8, dV in FP8, the format of dS for dK and dQ or None for bf16)
RULES = {
    "bf16 (the kernels today)": (False, False, None),
    "dP in FP8": (True, False, None),
    "dP, dV in FP8": (True, True, None),
    "all in FP8 (dS E4M3)": (True, True, E4M3),
    "all in FP8 (dS E5M2)": (True, True, E5M2),
    "dV, dK, dQ in FP8 (dS E4M3), dP bf16": (False, True, E4M3),
}


def study_inputs(family: str, s: int, seed: int):
    """bf16 q, k, v of `family` (bench_k_scale_rules.family_inputs, the forward studies' inputs)
    and d_out ~ N(0, 1), each [1, s, h, d] on the CPU."""
    q, k, v = family_inputs(family, s, seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    d_out = torch.randn(q.shape, generator=gen).bfloat16()
    return [x.unsqueeze(0) for x in (q, k, v, d_out)]


def exact_gradients(q, k, v, d_out):
    """fp64 autograd of exact causal attention of the bf16 values: (dq, dk, dv) [s, h, d]."""
    q, k, v = (x[0].double().transpose(0, 1).requires_grad_() for x in (q, k, v))
    s = q.shape[1]
    scores = q @ k.transpose(1, 2) * HEAD_DIM**-0.5
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    out = torch.softmax(scores.masked_fill(~causal, -torch.inf), -1) @ v
    out.backward(d_out[0].double().transpose(0, 1))
    return [x.grad.transpose(0, 1) for x in (q, k, v)]


def _bf16(x):
    return x.to(torch.bfloat16).double()


def _cast(x, amax, fmt_max, dtype):
    """x cast to FP8 `dtype` with scale amax / fmt_max (broadcast), dequantized: fp64."""
    scale = amax / fmt_max  # 0 also where a subnormal amax underflows: the tile casts to 0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (x / scale).to(dtype).double() * scale


def per_token(x, zero_scale=0.0):
    """[h, s, d] bf16 values -> (E4M3 codes, scales [h, s, 1]), both fp64, x ~ codes * scales:
    the fork's per-token cast (reference.quantize.per_token_cast_to_fp8, the rule of Q and K). A
    token of zeros gets scale `zero_scale`: 0 is what the folded tiles need (rule_gradients); the
    cast's own 1 is the leaky convention of the negative control."""
    codes, scale_inv = per_token_cast_to_fp8(x.float())
    zero = x.abs().amax(-1) == 0
    scales = torch.where(zero, zero_scale, scale_inv.double())
    return codes.double(), scales.unsqueeze(-1)


def per_block(x, dim, fmt_max, dtype):
    """x [h, s, s] cast per BLOCK entries along `dim` (1: rows, 2: keys) for each index of the
    other: the per-tile scale of a step's register operand."""
    h, n, m = x.shape
    if dim == 1:
        blocks = x.view(h, n // BLOCK, BLOCK, m)
        amax = blocks.abs().amax(2, keepdim=True)
    else:
        blocks = x.view(h, n, m // BLOCK, BLOCK)
        amax = blocks.abs().amax(3, keepdim=True)
    return _cast(blocks, amax, fmt_max, dtype).view(h, n, m)


def rule_gradients(rule, q8, s_q, k8, s_k, v, out, d_out, zero_scale=0.0):
    """(dq, dk, dv) [s, h, d] fp64 of `rule` from forward_operands (the forward's FP8 Q and K with
    their token scales, V, O and dO); s a multiple of BLOCK.

    The folded tiles: dV = P^T . dO = (P * s_dO)^T . dO8 with dO = dO8 * s_dO per row, so the
    register tile P * s_dO is cast per (key, 64-row block); likewise dS * s_Q for dK and dS * s_K
    for dQ. A row of dO that is all zeros (a loss that does not reach it) must give a zero row of
    P * s_dO, hence s_dO = 0 for it: with scale 1 its probabilities would enter the amax of the
    other rows of its block (zero_scale=1.0, the negative control)."""
    q_dq, k_dq = q8 * s_q, k8 * s_k  # the forward's dequantized operands
    s = q_dq.shape[1]
    scale = HEAD_DIM**-0.5
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    scores = (q_dq @ k_dq.transpose(1, 2) * scale).masked_fill(~causal, -torch.inf)
    p = torch.softmax(scores, -1)
    delta = (d_out * out).sum(-1, keepdim=True)
    fp8_dp, fp8_dv, ds_format = RULES[rule]
    do8, s_do = per_token(d_out, zero_scale)
    if fp8_dp:
        v8, s_v = per_token(v)
        dp = (do8 * s_do) @ (v8 * s_v).transpose(1, 2)
    else:
        dp = d_out @ v.transpose(1, 2)
    ds = p * (dp - delta)
    if fp8_dv:
        dv = per_block(p * s_do, 1, *E4M3).transpose(1, 2) @ do8
    else:
        dv = _bf16(p).transpose(1, 2) @ d_out
    if ds_format is not None:
        dk = per_block(ds * s_q, 1, *ds_format).transpose(1, 2) @ q8 * scale
        dq = per_block(ds * s_k.transpose(1, 2), 2, *ds_format) @ k8 * scale
    else:
        dk = _bf16(ds).transpose(1, 2) @ _bf16(q_dq) * scale
        dq = _bf16(ds) @ _bf16(k_dq) * scale
    return [x.transpose(0, 1) for x in (dq, dk, dv)]


def forward_operands(q, k, v, d_out):
    """rule_gradients' inputs from bf16 q, k, v, d_out [1, s, h, d], fp64 [h, s, d]: the fork's
    forward (reference, current scaling) gives O; Q and K as its per-token casts, codes and scales
    ([h, s, 1])."""
    out = reference_attention("fork-current", q, k, v, attn_mask_type="causal").out
    heads = lambda x: x[0].transpose(0, 1)  # [1, s, h, d] -> [h, s, d]
    q8, s_q = per_token(heads(q))
    k8, s_k = per_token(heads(k))
    return q8, s_q, k8, s_k, *(heads(x).double() for x in (v, out, d_out))


def study(seqlens, seed=0):
    results = []
    for s in seqlens:
        for i, family in enumerate(FAMILIES):
            q, k, v, d_out = study_inputs(family, s, seed + i)
            exact = exact_gradients(q, k, v, d_out)
            args = forward_operands(q, k, v, d_out)
            for rule in RULES:
                grads = rule_gradients(rule, *args)
                row = {"s": s, "family": family, "rule": rule}
                for name, g, ref in zip(("dq", "dk", "dv"), grads, exact):
                    row[f"{name}_rel"] = rel_frobenius_error(g, ref)
                    row[f"{name}_cos"] = cosine_similarity(g, ref)
                results.append(row)
                print(
                    f"s={s} {family:18s} {rule:26s} rel dq/dk/dv "
                    f"{row['dq_rel']:.4f} {row['dk_rel']:.4f} {row['dv_rel']:.4f}",
                    flush=True,
                )
    return results


def markdown(results) -> str:
    lines = [
        "Relative Frobenius error against exact fp64 gradients (cosine: the smallest of dq, dk,"
        " dv), causal, b=1, h=2, d=128, fp64 emulation; forward: the fork's (current scaling)",
        "",
        "| s | family | rule | dq | dk | dv | min cosine |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cos = min(r["dq_cos"], r["dk_cos"], r["dv_cos"])
        lines.append(
            f"| {r['s']} | {r['family']} | {r['rule']} | {r['dq_rel']:.4f} | {r['dk_rel']:.4f} |"
            f" {r['dv_rel']:.4f} | {cos:.5f} |"
        )
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = study(args.seqlens)
    text = markdown(results)
    (args.out / "backward_fp8_rules.md").write_text(text)
    (args.out / "backward_fp8_rules.json").write_text(json.dumps(results, indent=1))
    print(text)


if __name__ == "__main__":
    main()
