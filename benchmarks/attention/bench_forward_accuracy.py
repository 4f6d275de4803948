"""Accuracy of the mask-exact FP8 forward against fp64 attention at long sequences, on the GPU.

    python benchmarks/attention/bench_forward_accuracy.py --out DIR [--backends cuda,triton]
        [--seqlens 4096,16384] [--families normal,fa3_outliers,v_mean4,v_mean16]

Causal bshd, bf16, b = 1, h = 4, d = 128, current scaling. The truth is exact attention of the
bf16 inputs in fp64 on the GPU (blocks of query rows). Input families (Q, K, V each):
  normal        N(0, 1)
  fa3_outliers  N(0, 1) with 0.1 % of the entries drawn from N(0, 10^2) (the FA3 paper's)
  v_meanM       Q, K ~ N(0, 1) and V ~ N(M, 1): every tile adds the same sign to a row's
                running numerator (Note [Two-level P.V accumulation])
Columns: the relative Frobenius error of O, the same over the last 1024 rows (the rows with the
most KV tiles), the largest |LSE - LSE_fp64|, and a checksum of the output bits (equal sums
for two builds: the same bits, in practice). Each backend runs in this process, so compare
builds by running the script once per build (PYTHONPATH=BUILD_DIR:.).

Writes DIR/forward_accuracy.md and DIR/forward_accuracy.json, and prints the table.
"""

import argparse
import json
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import (  # noqa: E402
    kernels,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (  # noqa: E402
    rel_frobenius_error,
)

BATCH, HEADS, HEAD_DIM = 1, 4, 128
TAIL_ROWS = 1024


def fp64_causal_attention(q, k, v, rows: int = 2048):
    """(out [b, s, h, d] fp64, lse [b, h, s] fp64) of causal attention, in blocks of rows."""
    b, s, h, d = q.shape
    out = torch.empty(b, s, h, d, dtype=torch.float64, device=q.device)
    lse = torch.empty(b, h, s, dtype=torch.float64, device=q.device)
    keys = torch.arange(s, device=q.device)
    for bi in range(b):
        for hi in range(h):
            kk, vv = k[bi, :, hi].double(), v[bi, :, hi].double()
            for r0 in range(0, s, rows):
                scores = q[bi, r0 : r0 + rows, hi].double() @ kk.T / math.sqrt(d)
                hidden = keys[None, :] > keys[r0 : r0 + rows, None]
                scores.masked_fill_(hidden, -math.inf)
                m = scores.max(1, keepdim=True).values
                p = torch.exp(scores - m)
                l = p.sum(1, keepdim=True)
                out[bi, r0 : r0 + rows, hi] = (p @ vv) / l
                lse[bi, hi, r0 : r0 + rows] = (m + torch.log(l)).squeeze(1)
    return out, lse


def family_inputs(name: str, s: int, seed: int):
    """q, k, v [1, s, HEADS, HEAD_DIM] bf16 on the GPU for input family `name`."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (BATCH, s, HEADS, HEAD_DIM)
    tensors = []
    for which in range(3):
        x = torch.randn(shape, generator=gen, device="cuda")
        if name == "fa3_outliers":
            outlier = torch.rand(shape, generator=gen, device="cuda") < 1e-3
            x = torch.where(outlier, 10.0 * torch.randn(shape, generator=gen, device="cuda"), x)
        elif name.startswith("v_mean") and which == 2:
            x = x + float(name[len("v_mean") :])
        elif name != "normal" and not name.startswith("v_mean"):
            raise ValueError(f"unknown input family {name!r}")
        tensors.append(x.bfloat16())
    return tensors


def measure(backend: str, family: str, s: int) -> dict:
    q, k, v = family_inputs(family, s, seed=s + len(family))
    out, lse = kernels.attention_forward(
        q, k, v, backend=backend, recipe="current", qkv_format="bshd", attn_mask_type="causal"
    )
    ref_out, ref_lse = fp64_causal_attention(q, k, v)
    bits = int(out.view(torch.int16).to(torch.int64).sum())
    return dict(
        backend=backend,
        family=family,
        s=s,
        rel_fro=rel_frobenius_error(out, ref_out),
        rel_fro_tail=rel_frobenius_error(out[:, -TAIL_ROWS:], ref_out[:, -TAIL_ROWS:]),
        lse_max_abs=float((lse.double().reshape(ref_lse.shape) - ref_lse).abs().max()),
        out_bits_sum=bits,
    )


def markdown(rows) -> str:
    lines = [
        f"Causal bshd bf16, b = {BATCH}, h = {HEADS}, d = {HEAD_DIM}, current scaling; errors "
        "against fp64 attention of the bf16 inputs",
        "",
        f"| backend | family | s | rel. Frobenius | last {TAIL_ROWS} rows | max abs LSE error |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['backend']} | {r['family']} | {r['s'] // 1024}k | {r['rel_fro']:.3e} |"
            f" {r['rel_fro_tail']:.3e} | {r['lse_max_abs']:.3e} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--backends", default="cuda,triton")
    parser.add_argument("--seqlens", default="4096,16384")
    parser.add_argument("--families", default="normal,fa3_outliers,v_mean4,v_mean16")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    rows = []
    for backend in args.backends.split(","):
        for s in (int(x) for x in args.seqlens.split(",")):
            for family in args.families.split(","):
                rows.append(measure(backend, family, s))
                print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    text = markdown(rows)
    (args.out / "forward_accuracy.md").write_text(text)
    (args.out / "forward_accuracy.json").write_text(json.dumps(dict(results=rows), indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
