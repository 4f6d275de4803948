"""The sm90 CUDA path on sbhd (TE's default format) against bshd, and the Triton path on sbhd.

    python benchmarks/attention/bench_formats.py [--seqlens 4096,8192,16384] [--out DIR]

Causal, b = 2, h = 16, d = 128, bf16, current scaling, through kernels.attention_forward and
kernels.attention_backward (the fork's package, no TE). Rows: the CUDA kernels on bshd, the CUDA
kernels on sbhd (bshd views of Q and K, bshd copies of V and dO, O and the gradients copied back:
cuda/attention.py, cuda/backward.py), and the Triton kernels on sbhd (what an sbhd call ran before
the CUDA kernels took it). Timing: CUDA events, median of 10 calls after one warm-up, the rows of
a shape one after another in one process. Prints a markdown table (and writes DIR/formats.md).
"""

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import (  # noqa: E402
    kernels,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (  # noqa: E402
    gpu_ms_per_call,
)

PATHS = (
    ("cuda bshd", "bshd", "cuda"),
    ("cuda sbhd", "sbhd", "cuda"),
    ("triton sbhd", "sbhd", "triton"),
)


def measure(s: int) -> list:
    gen = torch.Generator(device="cuda").manual_seed(0)
    bshd = [torch.randn(2, s, 16, 128, device="cuda", generator=gen).bfloat16() for _ in range(4)]
    sbhd = [x.transpose(0, 1).contiguous() for x in bshd]
    rows = []
    for name, qkv_format, backend in PATHS:
        q, k, v, d_out = bshd if qkv_format == "bshd" else sbhd
        kw = dict(backend=backend, recipe="current", qkv_format=qkv_format, attn_mask_type="causal")

        def forward():
            return kernels.attention_forward(q, k, v, **kw)

        def forward_backward():
            out, lse = forward()
            kernels.attention_backward(q, k, v, out, d_out, lse, **kw)

        ms = [gpu_ms_per_call(fn, warmup=1, calls=10) for fn in (forward, forward_backward)]
        rows.append((s, name, *ms))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqlens", default="4096,8192,16384")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    lines = ["| s | path | fwd ms | fwd+bwd ms |", "|---|---|---|---|"]
    for s in (int(x) for x in args.seqlens.split(",")):
        for row in measure(s):
            lines.append("| {} | {} | {:.3f} | {:.3f} |".format(*row))
            print(lines[-1], flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "formats.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
