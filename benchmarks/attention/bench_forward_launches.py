"""The CUDA backend's one-call forward, launch by launch: how long each of its kernels runs.

    python benchmarks/attention/bench_forward_launches.py [--calls 20] [--out DIR]

Causal bshd, bf16, d = 128, the shapes and inputs of bench_sm90_forward.py. Per shape, torch.profiler
records --calls forwards (kernels.attention_forward, backend "cuda") after warm-up calls; each
CUDA kernel's duration is averaged over the calls, and the span from the first kernel's start to
the last kernel's end of a call (its GPU time without the host before the first launch) is
reported beside the sum of the kernel durations (the difference: the gaps between launches).
For reference, a device-to-device copy of the bytes the casts read and write (torch's copy_ of
a buffer of that size, read + write) runs in the same profile: "casts / copy" is the casts'
time over the copy's.

Prints a markdown table; with --out, writes DIR/forward_launches.md and .json.
"""

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, also under PYTHONSAFEPATH

from bench_sm90_forward import HEAD_DIM, SHAPES, causal_inputs  # noqa: E402
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import (  # noqa: E402
    kernels,
)

KW = dict(recipe="current", qkv_format="bshd", attn_mask_type="causal", backend="cuda")


def _cast_bytes(b, h, h_kv, s) -> int:
    """Bytes the casts move: Q, K and V read in bf16, Q8, K8 and V8^T written (scales aside)."""
    elems_q, elems_kv = b * s * h * HEAD_DIM, b * s * h_kv * HEAD_DIM
    return 3 * (elems_q + 2 * elems_kv)


def _kernel_events(prof):
    """[(name, start_us, duration_us)] of the CUDA kernels the profile saw, in start order."""
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(
        ((e.name, e.time_range.start, e.time_range.end - e.time_range.start) for e in events),
        key=lambda x: x[1],
    )


def measure(shape, calls: int):
    q, k, v = causal_inputs(shape)
    nbytes = _cast_bytes(*shape)
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        kernels.attention_forward(q, k, v, **KW)
        dst.copy_(src)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            kernels.attention_forward(q, k, v, **KW)
            torch.cuda.synchronize()
            dst.copy_(src)
            torch.cuda.synchronize()
    durations = defaultdict(list)
    spans, kernel_sums, call = [], [], []
    for name, start, dur in _kernel_events(prof):
        if "memcpy" in name.lower():  # the reference copy
            durations["d2d copy (reference)"].append(dur)
            continue
        durations[name].append(dur)
        call.append((start, dur))
        if "attention_fwd" in name:  # a call's last launch
            spans.append(start + dur - call[0][0])
            kernel_sums.append(sum(d for _, d in call))
            call = []
    if len(spans) != calls:
        seen = [(n[:30], round(t, 1), round(d, 1)) for n, t, d in _kernel_events(prof)[:12]]
        raise RuntimeError(f"{len(spans)} calls found, {calls} made; first events: {seen}")
    rows = {name: statistics.mean(d) for name, d in durations.items()}
    return dict(
        shape=list(shape),
        kernels_us=rows,
        span_us=statistics.median(spans),
        kernel_sum_us=statistics.median(kernel_sums),
        cast_bytes=nbytes,
    )


def _short(name: str) -> str:
    for key, label in (("attention_fwd", "attention kernel"), ("rowwise_cast", "Q/K cast"),
                       ("cast_transposed", "V cast")):  # fmt: skip
        if key in name:
            return label
    return name[:40]


def markdown(results) -> str:
    lines = [
        "| b, h, h_kv, s | attention kernel us | Q/K cast us | V cast us | casts / copy of "
        "their bytes | call span us | gaps us |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ks = {}
        for name, us in r["kernels_us"].items():
            ks[_short(name)] = ks.get(_short(name), 0.0) + us
        casts = sum(us for label, us in ks.items() if "cast" in label)
        copy = ks.get("d2d copy (reference)", float("nan"))
        b, h, h_kv, s = r["shape"]
        lines.append(
            f"| {b}, {h}, {h_kv}, {s // 1024}k | {ks.get('attention kernel', 0):.1f} | "
            f"{ks.get('Q/K cast', 0):.1f} | {ks.get('V cast', 0):.1f} | {casts / copy:.2f}x "
            f"({copy:.1f} us) | {r['span_us']:.1f} | {r['span_us'] - r['kernel_sum_us']:.1f} |"
        )
    names = sorted({n for r in results for n in r["kernels_us"]})
    lines.append("")
    lines.append("Kernels seen: " + "; ".join(f"`{n[:90]}`" for n in names))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not kernels.backend_available("cuda"):
        sys.exit("the CUDA backend is not available here (an sm90 GPU and the built kernel)")
    results = [measure(shape, args.calls) for shape in SHAPES]
    table = markdown(results)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "forward_launches.md").write_text(table + "\n")
        (args.out / "forward_launches.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
