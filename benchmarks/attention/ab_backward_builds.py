"""Speed of several builds of the CUDA backward side by side, with a per-kernel breakdown.

    python benchmarks/attention/ab_backward_builds.py --out DIR --lib base=DIR_A --lib new=DIR_B \
        [--rounds 3]

A Python process loads one `transformer_engine_exact_fp8`, so each build runs in its own process
(this file with --child): round r times kernels.attention_backward on the CUDA backend (causal
bshd bf16 d = 128, current scaling, after the CUDA forward) at each shape, the builds in rotated
order, so that drifts of the device clock spread over every build; the first round also records
torch.profiler's device time per kernel of one 8k backward. The table holds the median over
rounds of each build's milliseconds and its ratio to the first build, torch's cuDNN BF16 SDPA
backward of the same shape beside it (timed in the first build's processes).
Writes DIR/ab_backward.md and DIR/ab_backward.json and prints the table.

A child's PYTHONPATH is its build's folder first, then this checkout: a build whose Python
launcher differs from this checkout's (new arguments of the extension's functions) carries its
own copy of the package, DIR_B/transformer_engine/pytorch/attention/dot_product_attention/
exact_fp8, which the child then imports instead of this checkout's (the folders above it are
namespace packages).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
# (b, h, h_kv, s): issue 21's MHA shapes and a GQA one
SHAPES = ((2, 16, 16, 4096), (2, 16, 16, 8192), (2, 16, 16, 16384), (1, 64, 8, 8192))
PROFILE_SHAPE = (2, 16, 16, 8192)


def _lib(text: str):
    name, sep, path = text.partition("=")
    if not sep or not name or not Path(path).is_dir():
        raise argparse.ArgumentTypeError(f"expected NAME=DIR with an existing DIR, got {text!r}")
    return name, Path(path).resolve()


def _inputs(b, h, h_kv, s):
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    q, do = (torch.randn(b, s, h, 128, device="cuda", generator=g).bfloat16() for _ in range(2))
    k, v = (torch.randn(b, s, h_kv, 128, device="cuda", generator=g).bfloat16() for _ in range(2))
    return q, k, v, do


def _fork_backward(shape):
    from bench_backward import fork_backward  # in the child: it loads the build's extension

    return fork_backward(*_inputs(*shape), "current", backend="cuda")


def _sdpa_backward(shape):
    from bench_backward import sdpa_backward

    return sdpa_backward(*_inputs(*shape), "cudnn", with_forward=False)


def _profile(fn) -> dict:
    """Device microseconds per kernel name over 5 calls of fn, per call."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    times = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us > 0 and e.count > 0:
            times[e.key[:80]] = round(us / 5, 1)
    return dict(sorted(times.items(), key=lambda kv: -kv[1])[:12])


def child(args) -> None:
    import torch
    import triton

    result = {"ms": {}, "sdpa_ms": {}, "profile": None}
    for shape in SHAPES:
        fn = _fork_backward(shape)
        result["ms"][str(shape)] = triton.testing.do_bench(fn, warmup=50, rep=300)
        if args.profile and shape == PROFILE_SHAPE:
            result["profile"] = _profile(fn)
        del fn
        if args.sdpa:
            result["sdpa_ms"][str(shape)] = triton.testing.do_bench(
                _sdpa_backward(shape), warmup=50, rep=300
            )
        torch.cuda.empty_cache()
    Path(args.child).write_text(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--lib", type=_lib, action="append", default=[])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sdpa", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if not args.lib:
        ap.error("at least one --lib NAME=DIR")
    args.out.mkdir(parents=True, exist_ok=True)
    names = [n for n, _ in args.lib]
    runs = {n: [] for n in names}
    for r in range(args.rounds):
        order = args.lib[r % len(args.lib) :] + args.lib[: r % len(args.lib)]
        for name, lib in order:
            path = args.out / f"round{r}_{name}.json"
            cmd = [sys.executable, __file__, "--out", str(args.out), "--child", str(path)]
            cmd += ["--profile"] if r == 0 else []
            cmd += ["--sdpa"] if name == names[0] else []
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(lib), str(ROOT)]))
            subprocess.run(cmd, env=env, check=True)
            runs[name].append(json.loads(path.read_text()))
    lines = [
        f"CUDA backward, ms (median of {args.rounds} rounds, builds rotated), causal bshd bf16"
        f" d=128, current scaling; ratio to {names[0]}; cuDNN BF16 SDPA backward beside it",
        "",
        "| b, h, h_kv, s | " + " | ".join(names) + " | sdpa cudnn bwd |",
        "|---|" + "---|" * (len(names) + 1),
    ]
    medians = {}
    for shape in SHAPES:
        key = str(shape)
        med = {n: statistics.median(run["ms"][key] for run in runs[n]) for n in names}
        sdpa = statistics.median(run["sdpa_ms"][key] for run in runs[names[0]])
        medians[key] = {**med, "sdpa cudnn bwd": sdpa}
        cells = [
            f"{med[n]:.3f} ({med[names[0]] / med[n]:.3f}x, {sdpa / med[n]:.2f} sdpa)" for n in names
        ]
        lines.append(f"| {', '.join(map(str, shape))} | " + " | ".join(cells) + f" | {sdpa:.3f} |")
    lines += ["", f"Device us per kernel, one backward at {PROFILE_SHAPE} (round 0):", ""]
    for n in names:
        lines.append(f"- {n}: " + "; ".join(f"{k} {v}" for k, v in runs[n][0]["profile"].items()))
    text = "\n".join(lines) + "\n"
    (args.out / "ab_backward.md").write_text(text)
    (args.out / "ab_backward.json").write_text(json.dumps({"medians": medians, "runs": runs}))
    print(text)


if __name__ == "__main__":
    main()
