"""Launches of the sm_90a attention kernel alone, for a profiler or a memory checker to watch.

    python benchmarks/attention/profile_sm90.py [--shape B,H,H_KV,S] [--mask causal] [--calls 4]
    python benchmarks/attention/profile_sm90.py --small     (the memory checker's shapes)
    python benchmarks/attention/profile_sm90.py --backward [--shape ...] [--calls 4]

Quantizes random bf16 Q, K and V once (bshd, d = 128, current scaling), then launches the kernel
--calls times on them (a profiler skips the first ones: `ncu --launch-skip 3 --launch-count 1
-k regex:attention_fwd`). --small instead runs a few small shapes (unaligned lengths, GQA, both
masks; d = 128 and 64) through the CUDA backend's forward once each and checks that every
output is finite.
--backward runs the CUDA forward once and then the CUDA backward --calls times (its two kernels:
`-k regex:attention_bwd`); with --small, the small shapes through the CUDA backward once each.
"""

import argparse
import itertools
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import (  # noqa: E402
    kernels,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.cuda import (  # noqa: E402
    attention as cuda_attention,
)

HEAD_DIM = 128
# (b, h, h_kv, s, mask): unaligned lengths, a partial last tile, GQA, a one-tile sequence, and
# more query tiles than an H100/H200 has SMs (more than one wave of CTAs)
SMALL = [(2, 4, 4, 300, "causal"), (2, 4, 2, 257, "no_mask"), (1, 8, 1, 130, "causal"),
         (3, 2, 2, 128, "no_mask"), (1, 2, 2, 1, "causal"), (2, 16, 4, 520, "causal"),
         (2, 16, 4, 520, "no_mask")]  # fmt: skip


def _inputs(b, h, h_kv, s, seed=0, head_dim=HEAD_DIM):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, s, h, head_dim, generator=gen, device="cuda").bfloat16()
    k, v = (torch.randn(b, s, h_kv, head_dim, generator=gen, device="cuda").bfloat16()
            for _ in range(2))  # fmt: skip
    return q, k, v


def kernel_launches(shape, mask, calls):
    b, h, h_kv, s = shape
    q, k, v = _inputs(b, h, h_kv, s)
    ops = cuda_attention.quantize_operands(q, k, v, qkv_format="bshd")
    out = torch.empty_like(q)
    lse = torch.empty(h, b * s, dtype=torch.float32, device="cuda")
    for _ in range(calls):
        cuda_attention.launch(ops, out, lse, mask == "causal", HEAD_DIM**-0.5)
    torch.cuda.synchronize()
    print(f"{calls} launches of {shape} {mask}: output finite {bool(torch.isfinite(out).all())}")


def _cuda_backward(q, k, v, mask, calls=1) -> bool:
    """The CUDA forward once, then the CUDA backward `calls` times: are its gradients finite?"""
    d_out = torch.randn_like(q)
    kw = dict(recipe="current", qkv_format="bshd", attn_mask_type=mask)
    out, lse = kernels.attention_forward(q, k, v, backend="cuda", **kw)
    for _ in range(calls):
        grads = kernels.attention_backward(q, k, v, out, d_out, lse, backend="cuda", **kw)
    torch.cuda.synchronize()
    return all(bool(torch.isfinite(g).all()) for g in grads)


def backward_launches(shape, mask, calls):
    finite = _cuda_backward(*_inputs(*shape), mask, calls)
    print(f"{calls} backwards of {shape} {mask}: gradients finite {finite}")


def small_backwards():
    bad = 0
    for b, h, h_kv, s, mask in SMALL:
        finite = _cuda_backward(*_inputs(b, h, h_kv, s, seed=s), mask)
        bad += not finite
        print(f"b={b} h={h} h_kv={h_kv} s={s} {mask}: gradients finite {finite}")
    return 1 if bad else 0


def small_forwards():
    """The small shapes through the CUDA forward at both head dims (the backward's CUDA path
    takes d = 128 only)."""
    bad = 0
    for (b, h, h_kv, s, mask), d in itertools.product(SMALL, (128, 64)):
        q, k, v = _inputs(b, h, h_kv, s, seed=s, head_dim=d)
        out, lse = kernels.attention_forward(
            q, k, v, backend="cuda", recipe="current", qkv_format="bshd", attn_mask_type=mask
        )
        torch.cuda.synchronize()
        finite = bool(torch.isfinite(out).all())
        bad += not finite
        print(f"b={b} h={h} h_kv={h_kv} s={s} d={d} {mask}: output finite {finite}")
    return 1 if bad else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="2,16,16,8192", help="b,h,h_kv,s")
    parser.add_argument("--mask", choices=("causal", "no_mask"), default="causal")
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--small", action="store_true", help="the memory checker's small shapes")
    parser.add_argument("--backward", action="store_true", help="launch the CUDA backward")
    args = parser.parse_args()
    if not kernels.backend_available("cuda"):
        print("the CUDA backend is not available here (needs the sm_90a kernel and an sm90 GPU)")
        return 1
    if args.small:
        return small_backwards() if args.backward else small_forwards()
    shape = tuple(int(x) for x in args.shape.split(","))
    (backward_launches if args.backward else kernel_launches)(shape, args.mask, args.calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
