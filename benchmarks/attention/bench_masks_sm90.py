"""The sm90 CUDA forward against the Triton forward on the calls beyond dense causal: padding
masks, thd packs, sliding windows and d = 64.

    python benchmarks/attention/bench_masks_sm90.py [--out DIR] [--rounds 3]

bf16, current scaling, h = 16 (h_kv = 16), through kernels.attention_forward (the fork's package,
quantization included, no TE). Timing: CUDA events, median of 10 calls after one warm-up per
round, the backends of a case one after the other, median over rounds. TFLOPS count the visible
(row, key) pairs of the mask: 4 * h * d * pairs / time. Prints a markdown table (and writes
DIR/masks_sm90.md).
"""

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import (  # noqa: E402
    kernels,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import (  # noqa: E402,E501
    allowed_positions,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (  # noqa: E402,E501
    gpu_ms_per_call,
)

HEADS = 16


def _cu(lengths):
    return torch.tensor([0] + list(lengths)).cumsum(0).int().cuda()


def _dense(b, s, d, mask, window=None, lens=None):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, s, HEADS, d, device="cuda", generator=gen).bfloat16() for _ in "qkv")
    kw = dict(qkv_format="bshd", attn_mask_type=mask, window_size=window)
    if lens is not None:
        kw.update(cu_seqlens_q=_cu(lens), cu_seqlens_kv=_cu(lens))
    pairs = sum(
        int(allowed_positions(mask, window, n, n).sum()) for n in (lens or [s] * b)
    )  # fmt: skip
    return (q, k, v), kw, pairs


def _thd(lens, d, mask, window=None):
    gen = torch.Generator(device="cuda").manual_seed(0)
    t = sum(lens)
    q, k, v = (torch.randn(t, HEADS, d, device="cuda", generator=gen).bfloat16() for _ in "qkv")
    kw = dict(qkv_format="thd", attn_mask_type=mask, window_size=window,
              cu_seqlens_q=_cu(lens), cu_seqlens_kv=_cu(lens), max_seqlen_q=max(lens),
              max_seqlen_kv=max(lens))  # fmt: skip
    pairs = sum(int(allowed_positions(mask, window, n, n).sum()) for n in lens)
    return (q, k, v), kw, pairs


CASES = {
    "bshd padding_causal b=4 s=4k (lens 4096/3000/2048/1000)": lambda: _dense(
        4, 4096, 128, "padding_causal", lens=[4096, 3000, 2048, 1000]
    ),
    "thd padding_causal 8 seqs (16k tokens)": lambda: _thd(
        [4096, 3000, 2500, 2048, 1800, 1500, 800, 640], 128, "padding_causal"
    ),
    "causal window (1024, 0) b=2 s=8k": lambda: _dense(2, 8192, 128, "causal", (1024, 0)),
    "no_mask window (512, 512) b=2 s=8k": lambda: _dense(2, 8192, 128, "no_mask", (512, 512)),
    "causal d=64 b=2 s=8k": lambda: _dense(2, 8192, 64, "causal"),
}


def measure(name, rounds):
    (q, k, v), kw, pairs = CASES[name]()
    d = q.shape[-1]
    times = {b: [] for b in kernels.BACKENDS}
    for _ in range(rounds):
        for backend in kernels.BACKENDS:
            fn = lambda: kernels.attention_forward(q, k, v, backend=backend, recipe="current", **kw)
            times[backend].append(gpu_ms_per_call(fn, warmup=1, calls=10))
    ms = {b: statistics.median(t) for b, t in times.items()}
    tflops = {b: 4 * HEADS * d * pairs / (t * 1e-3) / 1e12 for b, t in ms.items()}
    return name, ms, tflops


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    lines = [
        "| case | cuda ms (TFLOPS) | triton ms (TFLOPS) | triton / cuda time |",
        "|---|---|---|---|",
    ]
    for name in CASES:
        name, ms, tflops = measure(name, args.rounds)
        lines.append(
            f"| {name} | {ms['cuda']:.3f} ({tflops['cuda']:.0f}) | {ms['triton']:.3f}"
            f" ({tflops['triton']:.0f}) | {ms['triton'] / ms['cuda']:.2f}x |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "masks_sm90.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
