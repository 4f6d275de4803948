"""Launches of cuDNN's attention forward for a profiler to watch, beside profile_sm90.py's.

    python benchmarks/attention/profile_cudnn_fp8.py {delayed,bf16} [--shape B,H,S] [--calls 5]

delayed: upstream TE's DotProductAttention under DelayedScaling(fp8_dpa=True), whose forward on
sm90 is cuDNN's per-tensor FP8 SDPA (it leaks: the kernel the fork is compared with); bf16:
torch's scaled_dot_product_attention on its cuDNN backend. Causal, bshd, d = 128: the N(0, 1)
bf16 inputs of bench_sm90_forward.causal_inputs (same seed, same draws), made here rather than
imported, because this script runs where only upstream TE is installed and bench_sm90_forward
imports the fork's package. Needs upstream TE for `delayed`. Nsight Compute on one launch (skip
the first ones):

    ncu --clock-control none --set full --import-source no -k regex:fprop --launch-skip 2 \
        --launch-count 1 -o cudnn_fp8 python benchmarks/attention/profile_cudnn_fp8.py delayed

then `ncu -i cudnn_fp8.ncu-rep --page source --csv --print-source sass > source.csv` and
`python benchmarks/attention/ncu_summary.py source.csv --per TILES` (TILES: the 128 x 128 tiles
a causal call visits, b h n (n + 1) / 2 for n = s / 128, to read instructions per tile).
"""

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HEAD_DIM = 128


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", choices=["delayed", "bf16"])
    parser.add_argument("--shape", default="2,16,8192", help="b,h,s")
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    b, h, s = map(int, args.shape.split(","))
    gen = torch.Generator(device="cuda").manual_seed(s)
    q, k, v = (
        torch.randn(b, s, h, HEAD_DIM, generator=gen, device="cuda").bfloat16() for _ in range(3)
    )
    if args.path == "delayed":
        import transformer_engine.pytorch as te
        from transformer_engine.common import recipe

        dpa = te.DotProductAttention(h, HEAD_DIM, qkv_format="bshd", attn_mask_type="causal")
        dpa = dpa.cuda().eval()
        fp8 = recipe.DelayedScaling(fp8_dpa=True)
        for _ in range(args.calls):
            with torch.no_grad(), te.autocast(enabled=True, recipe=fp8):
                out = dpa(q, k, v)
    else:
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for _ in range(args.calls):
                out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    torch.cuda.synchronize()
    print(f"{args.calls} {args.path} forwards of {args.shape}: finite {bool(out.isfinite().all())}")


if __name__ == "__main__":
    main()
