"""Speed of the sm_90a CUDA attention forward next to the Triton kernel and torch's BF16 SDPA.

    python benchmarks/attention/bench_sm90_forward.py --out DIR [--rounds 3] [--entries A,B]
        [--timing queued|synced] [--head-dim 128|64]

Causal bshd, bf16, d = 128 (or --head-dim 64), current scaling: MHA b = 2, h = 16 at s = 4k, 8k,
16k and GQA b = 1, h = 64, h_kv = 8 at s = 8k, 16k. Entries:
  "cuda"          the CUDA backend's forward, Q/K/V quantization included
  "cuda kernel"   the sm_90a kernel alone, on operands quantized beforehand
  "quantize"      the CUDA backend's Q, K and V quantization alone (what "cuda" adds)
  "kernel all-fp8" the kernel's LEAKY variant alone (fp8_v_everywhere: E4M3 P and V8^T on the
                  boundary tiles too): "cuda kernel" over it, minus 1, is the exactness cost
  "triton"        the Triton backend's forward (K/V quantization included; Q cast in-kernel)
  "sdpa flash", "sdpa cudnn"  torch's BF16 scaled_dot_product_attention backends
  "te fork", "te bf16", "te delayed"  TE's DotProductAttention (eval, no grad) under
                  Float8CurrentScaling(fp8_dpa=True) (the fork's mask-exact path), autocast off,
                  and DelayedScaling(fp8_dpa=True) (upstream's per-tensor cuDNN FP8 SDPA); only
                  where transformer_engine imports
  "cuda profiled", "te fork kernel", "te delayed kernel"  the longest GPU kernel of "cuda" / "te
                  fork" / "te delayed" alone (the attention kernel: the fork's, the fork's
                  through TE, cuDNN's per-tensor FP8 SDPA), its duration as the CUDA profiler
                  records it (testing.gpu_kernel_ms; the JSON names the kernel). cuDNN's kernel
                  cannot be called without its casts, so it is compared with "cuda profiled",
                  the fork's kernel timed the same way
FLOPs (causal, as issue 20 counts them) = 2*b*h*s*s*d; TFLOPS = FLOPs / time. Timing
(--timing): "queued" (the default since 2026-12-06), the GPU time per call of 10 calls queued
behind a sleep kernel, the host ahead of the GPU as in a training step and as TE's table
(benchmarks/te, triton's do_bench) measures (testing.gpu_ms_queued); "synced" (the tables
before 2026-12-06), the median of CUDA-event timings around each of 25 calls after 5 warm-up
calls, synchronized after each, so that whatever the GPU waits for before a call's first launch
counts (testing.gpu_ms_per_call). Entries are taken round-robin --rounds times; the table shows
the median over rounds. A missing entry (no Triton, a backend torch does not offer here) is
shown as "-" with the reason in the JSON.

Writes DIR/sm90_forward.md and DIR/sm90_forward.json, and prints the table.
"""

import argparse
import importlib
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[2]
try:  # an installed (or assembled) fork, whose TE rows can run
    importlib.import_module("transformer_engine.pytorch.attention.dot_product_attention.exact_fp8")
except ImportError:  # the checkout: the kernel rows only
    sys.path.insert(0, str(ROOT))

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import (  # noqa: E402
    kernels,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (  # noqa: E402
    gpu_kernel_ms,
    gpu_ms_per_call,
    gpu_ms_queued,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.cuda import (  # noqa: E402
    attention as cuda_attention,
)

HEAD_DIM = 128
# (b, h, h_kv, s)
SHAPES = [(2, 16, 16, 4096), (2, 16, 16, 8192), (2, 16, 16, 16384), (1, 64, 8, 8192),
          (1, 64, 8, 16384)]  # fmt: skip
ENTRIES = ("cuda", "cuda kernel", "kernel all-fp8", "quantize", "triton", "sdpa flash")
ENTRIES += ("sdpa cudnn", "te fork")
ENTRIES += ("te bf16", "te delayed", "cuda profiled", "te fork kernel", "te delayed kernel")
KERNEL_OF = {
    "cuda profiled": "cuda",
    "te fork kernel": "te fork",
    "te delayed kernel": "te delayed",
}
"""Entries timed as one kernel of another entry's call (gpu_kernel_ms)."""


def _entries(q, k, v):
    scale = q.shape[-1] ** -0.5
    kw = dict(recipe="current", qkv_format="bshd", attn_mask_type="causal")
    ops = cuda_attention.quantize_operands(q, k, v, qkv_format="bshd")
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[2], q.shape[0] * q.shape[1], dtype=torch.float32, device=q.device)
    entries = {
        "cuda": lambda: kernels.attention_forward(q, k, v, backend="cuda", **kw),
        "cuda kernel": lambda: cuda_attention.launch(ops, out, lse, True, scale),
        "kernel all-fp8": lambda: cuda_attention.launch(ops, out, lse, True, scale, True),
        "quantize": lambda: cuda_attention.quantize_operands(q, k, v, qkv_format="bshd"),
    }
    if kernels.backend_available("triton"):
        entries["triton"] = lambda: kernels.attention_forward(q, k, v, backend="triton", **kw)
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    gqa = q.shape[2] != k.shape[2]
    for name, backend in (("sdpa flash", SDPBackend.FLASH_ATTENTION),
                          ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION)):  # fmt: skip

        def sdpa(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=gqa)

        entries[name] = sdpa
    entries.update(_te_entries(q, k, v))
    return entries


def _te_entries(q, k, v):
    """TE's DotProductAttention under the fork's recipe, BF16 and DelayedScaling (if TE imports)."""
    try:
        import transformer_engine.pytorch as te
        from transformer_engine.common import recipe
    except ImportError:
        return {}
    recipes = {
        "te fork": recipe.Float8CurrentScaling(fp8_dpa=True),
        "te bf16": None,
        "te delayed": recipe.DelayedScaling(fp8_dpa=True),
    }

    def call(dpa, r):
        with torch.no_grad(), te.autocast(enabled=r is not None, recipe=r):
            return dpa(q, k, v)

    entries = {}
    for name, r in recipes.items():  # one module per recipe: a module keeps its recipe's state
        dpa = te.DotProductAttention(
            q.shape[2], q.shape[3], num_gqa_groups=k.shape[2], qkv_format="bshd",
            attn_mask_type="causal",
        ).cuda().eval()  # fmt: skip
        entries[name] = lambda dpa=dpa, r=r: call(dpa, r)
    return entries


TIMINGS = {"synced": gpu_ms_per_call, "queued": gpu_ms_queued}


def causal_inputs(shape, head_dim: int = HEAD_DIM):
    """Q, K, V [b, s, h or h_kv, head_dim] bf16 N(0, 1) on the GPU for shape (b, h, h_kv, s),
    seeded by s (bench_forward_launches.py times the same inputs)."""
    b, h, h_kv, s = shape
    gen = torch.Generator(device="cuda").manual_seed(s)
    q = torch.randn(b, s, h, head_dim, generator=gen, device="cuda").bfloat16()
    k, v = (
        torch.randn(b, s, h_kv, head_dim, generator=gen, device="cuda").bfloat16() for _ in range(2)
    )
    return q, k, v


def speed_table(rounds: int, only, timing: str, head_dim: int = HEAD_DIM):
    time_call = TIMINGS[timing]
    results, skipped, kernel_names = {}, {}, {}
    for shape in SHAPES:
        b, h, h_kv, s = shape
        q, k, v = causal_inputs(shape, head_dim)
        entries = _entries(q, k, v)
        entries.update({name: entries[of] for name, of in KERNEL_OF.items() if of in entries})
        runnable = {}
        for name, fn in entries.items():
            if only is not None and name not in only:
                continue
            try:
                fn()
                torch.cuda.synchronize()
            except (RuntimeError, ValueError) as err:  # e.g. an SDPA backend not offered here
                skipped[f"{name} {shape}"] = str(err).splitlines()[0]
            else:
                runnable[name] = fn
        times = {name: [] for name in runnable}
        names = list(runnable)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                if name in KERNEL_OF:
                    kernel_names[f"{name} {shape}"], ms = gpu_kernel_ms(runnable[name])
                    times[name].append(ms)
                else:
                    times[name].append(time_call(runnable[name]))
        flops = 2 * b * h * s * s * head_dim
        for name, t in times.items():
            ms = statistics.median(t)
            results[(shape, name)] = dict(ms=ms, tflops=flops / (ms * 1e-3) / 1e12)
        del q, k, v, runnable
        torch.cuda.empty_cache()
    return results, skipped, kernel_names


def markdown(results, rounds, timing: str, head_dim: int = HEAD_DIM) -> str:
    entries = [e for e in ENTRIES if any(name == e for _, name in results)]
    lines = [
        f"sm90 CUDA forward vs Triton, BF16 SDPA and TE: causal bshd bf16, d={head_dim};"
        f" TFLOPS = 2*b*h*s*s*d / time (median of {rounds} rounds; timing: {timing})",
        "",
        "| b, h, h_kv, s | " + " | ".join(entries) + " | cuda / best bf16 sdpa | exactness cost"
        " | cuda / cudnn fp8 kernel | cuda profiled / cudnn fp8 kernel |",
        "|---|" + "---|" * (len(entries) + 4),
    ]
    for shape in SHAPES:
        cells = []
        for name in entries:
            r = results.get((shape, name))
            cells.append(f"{r['tflops']:.0f} ({r['ms']:.2f} ms)" if r else "-")
        sdpa = [results[(shape, n)]["ms"] for n in ("sdpa flash", "sdpa cudnn")
                if (shape, n) in results]  # fmt: skip
        cuda = results.get((shape, "cuda"))
        ratio = f"{min(sdpa) / cuda['ms']:.2f}x" if sdpa and cuda else "-"
        kernel, all_fp8 = results.get((shape, "cuda kernel")), results.get(
            (shape, "kernel all-fp8")
        )
        cost = f"{kernel['ms'] / all_fp8['ms'] - 1:+.1%}" if kernel and all_fp8 else "-"
        cudnn = results.get((shape, "te delayed kernel"))
        profiled = results.get((shape, "cuda profiled"))
        to_cudnn = [
            f"{cudnn['ms'] / r['ms']:.2f}x" if cudnn and r else "-" for r in (cuda, profiled)
        ]
        b, h, h_kv, s = shape
        lines.append(
            f"| {b}, {h}, {h_kv}, {s // 1024}k | "
            + " | ".join(cells)
            + f" | {ratio} | {cost} | "
            + " | ".join(to_cudnn)
            + " |"
        )
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timing", choices=sorted(TIMINGS), default="queued")
    parser.add_argument("--head-dim", type=int, choices=(64, 128), default=HEAD_DIM)
    parser.add_argument(
        "--entries", help=f"comma-separated entries to run (default all: {', '.join(ENTRIES)})"
    )
    args = parser.parse_args()
    only = None
    if args.entries:
        only = [e.strip() for e in args.entries.split(",")]
        unknown = [e for e in only if e not in ENTRIES]
        if unknown:
            parser.error(f"unknown entries {unknown}; known: {', '.join(ENTRIES)}")
    if not kernels.backend_available("cuda"):
        print("the CUDA backend is not available here (needs the sm_90a kernel and an sm90 GPU)")
        return 1
    results, skipped, kernel_names = speed_table(args.rounds, only, args.timing, args.head_dim)
    table = markdown(results, args.rounds, args.timing, args.head_dim)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sm90_forward.md").write_text(table)
    payload = dict(
        device=torch.cuda.get_device_name(),
        timing=args.timing,
        head_dim=args.head_dim,
        results=[dict(shape=list(shape), entry=name, **r) for (shape, name), r in results.items()],
        skipped=skipped,
        kernels=kernel_names,
    )
    (args.out / "sm90_forward.json").write_text(json.dumps(payload, indent=2))
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
