"""The backward's D = rowsum(dO * O) on inputs with a common offset, emulated in fp64 on the CPU.

    python benchmarks/attention/bench_backward_delta.py --out DIR [--seqlen 1024]
        [--cases 0:0,4:4,16:16,4:0,16:0]

Causal attention, b = 1, h = 1, d = 128, bf16 inputs: Q, K ~ N(0, 1), V ~ N(a, 1) and
dO ~ N(b, 1) for each case a:b. The forward is the fork's (reference_attention, current
scaling). Rows: four ways of getting D, the row term of dS = P * (dP - D), all else the fork's
straight-through backward (reference_attention_backward: P = softmax of the E4M3 scores in fp64,
dP = dO . V^T):

  D from O (today)       D = rowsum(dO * O), O the forward's output (E4M3 P8 and V8 inside)
  D from O, O / sum P8   the same with the forward's O divided by the sum of the weights it used
                         (P8 on FP8 tiles) instead of the fp32 sum of p; the LSE unchanged
  forward's operands     the backward made consistent with that O instead: on the FP8 tiles
                         P8 / l in place of P and the dequantized V8 in dP (D = rowsum(P * dP)
                         up to O's bf16 rounding)
  D from the own P       D = rowsum(P * dP) = dO . (P . V): the backward's own P and V

dS sums to zero over a row only when D matches the backward's own P and V. With a common offset
in both V and dO, dP carries a large common part (~d * a * b) that D must cancel exactly; D from
the forward's O leaves the forward's quantization error of that part in every dS of the row.
Making the backward consistent with the forward does not help: dP - D is then dO . (V8_j - O),
and V8's rounding error (~2^-4 of |V|, so of the offset) is large against V's spread around
its mean, which is what dq and dk are made of. Columns: relative Frobenius error of dq, dk, dv
against the exact fp64 gradients of the unquantized bf16 inputs, and the forward's own error.

Writes DIR/backward_delta.md and DIR/backward_delta.json, and prints the table.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import (  # noqa: E402
    to_tokens,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference import (  # noqa: E402
    attention as ref_attention,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.backward import (  # noqa: E402
    reference_attention_backward,
    sequence_layouts,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (  # noqa: E402
    rel_frobenius_error,
)

HEAD_DIM = 128


def inputs(s: int, offset: float, d_out_offset: float = None, seed: int = 13):
    """q, k, v, d_out [1, s, 1, HEAD_DIM] bf16: Q, K ~ N(0, 1), V ~ N(offset, 1) and
    dO ~ N(d_out_offset, 1) (d_out_offset None: the same offset as V)."""
    if d_out_offset is None:
        d_out_offset = offset
    gen = torch.Generator().manual_seed(seed)
    q, k, v, d_out = (torch.randn(1, s, 1, HEAD_DIM, generator=gen) for _ in range(4))
    return q.bfloat16(), k.bfloat16(), (v + offset).bfloat16(), (d_out + d_out_offset).bfloat16()


def causal_fp8_scores(q, k):
    """[s, s] fp64 scores of the E4M3 Q and K (the fork's per-token rule), -inf above the
    diagonal: the scores of both the fork's forward and its backward."""
    qt, kt = (to_tokens(x, "bshd") for x in (q, k))
    _, layout_kv = sequence_layouts(q, k, "bshd", "causal", None, None, None, None)
    q_dq, k_dq, _ = ref_attention.dequantized_operands(  # the scores need no V: K stands in
        "fork-current", qt, kt, kt, layout_kv, ref_attention.QuantConfig()
    )
    s = q.shape[1]
    hidden = ~torch.ones(s, s, dtype=torch.bool).tril()
    return (q_dq[:, 0] @ k_dq[:, 0].T * HEAD_DIM**-0.5).masked_fill(hidden, float("-inf"))


def used_weights(scores):
    """(p, w) [s, s] fp64 for the causal `scores`: p = exp(scores - row max), and the weights
    the fork's forward multiplies V with: P8 (E4M3 of p * P_SCALE, / P_SCALE) on the FP8 tiles,
    p on the boundary tiles."""
    p = torch.exp(scores - scores.amax(-1, keepdim=True))
    p8 = ref_attention.cast_to_e4m3((p * ref_attention.P_SCALE).float()).double()
    p8 = p8 / ref_attention.P_SCALE
    s = scores.shape[0]
    rows, cols = torch.arange(s) // ref_attention.Q_TILE, torch.arange(s) // ref_attention.KV_TILE
    fp8_tile = cols[None, :] < rows[:, None]  # causal: the tiles left of the diagonal tile
    return p, torch.where(fp8_tile, p8, p)


def normalized_by_used_weights(out, scores):
    """The fork's forward output `out` with O divided by the sum of the weights its P.V used (P8
    on the FP8 tiles, p on the boundary tiles) instead of the sum of p; fp64."""
    p, used = used_weights(scores)
    return out * (p.sum(-1) / used.sum(-1))[None, :, None, None]


def forward_operands_backward(q, k, v, out, d_out):
    """(dq, dk, dv) fp64 [1, s, 1, d] of the straight-through backward made consistent with the
    forward's O = sum(w V~) / l: weights w / l (used_weights: P8 on the FP8 tiles) in place of
    P, and V~ (the dequantized V8, the forward's) in dP on the FP8 tiles."""
    qt, kt, vt = (to_tokens(x, "bshd") for x in (q, k, v))
    _, layout_kv = sequence_layouts(q, k, "bshd", "causal", None, None, None, None)
    q_dq, k_dq, v_dq = ref_attention.dequantized_operands(
        "fork-current", qt, kt, vt, layout_kv, ref_attention.QuantConfig()
    )
    q_dq, k_dq, v_dq = q_dq[:, 0], k_dq[:, 0], v_dq[:, 0].double()
    v_hi, d_o, o = (x[0, :, 0].double() for x in (v, d_out, out))
    scores = causal_fp8_scores(q, k)
    p, used = used_weights(scores)
    weights = used / p.sum(-1, keepdim=True)
    fp8_tile = used != p  # where P8 differs from p: on the FP8 tiles (elsewhere the same anyway)
    d_p = torch.where(fp8_tile, d_o @ v_dq.T, d_o @ v_hi.T)
    d_s = weights * (d_p - (d_o * o).sum(-1, keepdim=True))
    scale = HEAD_DIM**-0.5
    grads = (d_s @ k_dq * scale, d_s.T @ q_dq * scale, weights.T @ d_o)
    return tuple(g[None, :, None, :] for g in grads)


def own_output(q, k, v):
    """P . V with the backward's own P (softmax of the E4M3 scores, fp64) and unquantized V:
    the O whose rowsum(dO * O) is rowsum(P * dP), the own D. fp64, shaped as q."""
    p = torch.softmax(causal_fp8_scores(q, k), -1)
    return (p @ v[0, :, 0].double())[None, :, None, :]


def measure(s: int, offset: float, d_out_offset: float) -> dict:
    q, k, v, d_out = inputs(s, offset, d_out_offset)
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    truth = ref_attention.reference_attention("bf16", *leaves, attn_mask_type="causal").out
    exact = torch.autograd.grad(truth, leaves, d_out.double())
    out = ref_attention.reference_attention("fork-current", q, k, v, attn_mask_type="causal").out
    out8 = normalized_by_used_weights(out, causal_fp8_scores(q, k))
    kw = dict(attn_mask_type="causal")
    rules = {
        "D from O (today)": (
            reference_attention_backward("current", q, k, v, out.bfloat16(), d_out, **kw),
            out,
        ),
        "D from O, O / sum P8": (
            reference_attention_backward("current", q, k, v, out8.bfloat16(), d_out, **kw),
            out8,
        ),
        "forward's operands": (
            forward_operands_backward(q, k, v, out8.bfloat16(), d_out),
            out8,
        ),
        "D from the own P": (
            reference_attention_backward("current", q, k, v, own_output(q, k, v), d_out, **kw),
            out,
        ),
    }
    return {
        name: dict(
            s=s,
            offset=offset,
            d_out_offset=d_out_offset,
            forward=rel_frobenius_error(fwd, truth.detach()),
            **{g: rel_frobenius_error(x, e) for g, x, e in zip(("dq", "dk", "dv"), grads, exact)},
        )
        for name, (grads, fwd) in rules.items()
    }


def markdown(results) -> str:
    lines = [
        "Causal, b = 1, h = 1, d = 128, V ~ N(a, 1), dO ~ N(b, 1); relative Frobenius errors",
        "against the exact fp64 gradients of the unquantized bf16 inputs (forward: the O that D",
        "is built from, against fp64 attention)",
        "",
        "| s | a (V) | b (dO) | D | forward | dq | dk | dv |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for per_rule in results:
        for name, r in per_rule.items():
            lines.append(
                f"| {r['s']} | {r['offset']:g} | {r['d_out_offset']:g} | {name} |"
                f" {r['forward']:.3e} | {r['dq']:.3e} |"
                f" {r['dk']:.3e} | {r['dv']:.3e} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument(
        "--cases", default="0:0,4:4,16:16,4:0,16:0", help="V and dO offsets, a:b,a:b,..."
    )
    args = parser.parse_args(argv)
    cases = [tuple(float(x) for x in c.split(":")) for c in args.cases.split(",")]
    results = [measure(args.seqlen, a, b) for a, b in cases]
    args.out.mkdir(parents=True, exist_ok=True)
    text = markdown(results)
    (args.out / "backward_delta.md").write_text(text)
    (args.out / "backward_delta.json").write_text(json.dumps(results, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
