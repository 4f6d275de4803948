"""Host time per attention call at a tiny shape, side by side in one run, and the host gaps of the
CUDA backend's forward at a large one.

    python benchmarks/attention/bench_host_time.py --out DIR [--calls 300] [--repeats 7]

Part 1, host microseconds per call at b=1, s=128, h=1, d=128, causal, bf16 (current scaling for
the fork), for:
  sdpa cudnn, sdpa flash    torch's scaled_dot_product_attention (bhsd views of bshd tensors)
  fork triton, fork cuda    kernels.attention_forward(backend=...) (quantization included);
                            "fork triton (JIT launch)" is the same with the compiled-launch cache
                            of triton/launch.py switched off (Triton's JIT binds every call)
  te bf16, te fork-current  TE's DotProductAttention (bshd, causal) with autocast disabled, and
                            under Float8CurrentScaling(fp8_dpa=True) (the fork's mask-exact path;
                            the mask-exact call count is checked), forward in eval/no_grad and,
                            marked "fwd+bwd", a train-mode forward plus backward
Method: N calls issued back to back; torch.cuda.synchronize() only before and after the loop, so
the wall-clock time of the loop over N is the host time per call whenever the GPU work of a call
is shorter. Next to it, "gpu": the GPU time per call without host gaps (40 calls queued behind a
long sleep kernel, CUDA events around them); a row is host-bound where host > gpu. Context
managers (torch's sdpa_kernel, TE's autocast, no_grad) are entered once around the loop, as a
model enters them once around many layers. Entries are taken round-robin `--repeats` times; the table shows the
median over repeats. Ratios are to "sdpa cudnn" of the same run (target: fork <= 2x).

Part 2, at b=2, s=8192, h=16, d=128, causal: GPU time (CUDA events around one call, median of
25 after 5 warm-up calls) of the CUDA backend's full forward, its kernel alone on operands
quantized beforehand, and its Q/K/V quantization alone; "host gaps" = forward - kernel -
quantization (time the GPU waits for the host between the small launches, and for the host's
work before the first one); "cuda forward queued": the forward's GPU time per call with 10 calls
queued behind a sleep kernel (no host gaps: what a call costs inside a busy stream, median of 5).
The Triton backend's forward for reference.

Entries that cannot run here (no CUDA backend: it needs the extension built with the sm_90a
kernel and an sm90 GPU; no transformer_engine) are skipped with the reason. Writes
DIR/host_time.md and DIR/host_time.json and prints the table.
"""

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import (  # noqa: E402
    kernels,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (  # noqa: E402
    gpu_ms_per_call,
    gpu_ms_queued,
)

TINY = (1, 128, 1, 128)  # b, s, h, d
LARGE = (2, 8192, 16, 128)
TARGET_RATIO = 2.0
KW = dict(recipe="current", qkv_format="bshd", attn_mask_type="causal")


def _inputs(shape, seed=0, grad=False):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = [torch.randn(*shape, device="cuda", generator=gen).bfloat16() for _ in range(3)]
    return [x.requires_grad_() for x in out] if grad else out


class Entry:
    """fn() is one call; context() is entered once around a loop of calls."""

    def __init__(self, fn, context=contextlib.nullcontext, check=None):
        self.fn, self.context, self.check = fn, context, check


def host_us(entry: Entry, calls: int) -> float:
    """Wall-clock microseconds per call of `calls` back-to-back calls (synchronize only around
    the loop)."""
    with entry.context():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            entry.fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


GPU_CALLS = 40


def gpu_us(entry: Entry, calls: int = GPU_CALLS) -> float:
    """GPU microseconds per call without host gaps: the calls are queued behind a long sleep
    kernel, so the GPU runs them back to back (testing.gpu_ms_queued)."""
    with entry.context():
        return gpu_ms_queued(entry.fn, warmup=0, calls=calls) * 1e3


def _sdpa_entries(q, k, v, grad_q=None):
    entries = {}
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    for name, which in (
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("flash", SDPBackend.FLASH_ATTENTION),
    ):
        ctx = lambda which=which: sdpa_kernel(which)
        entries[f"sdpa {name}"] = Entry(
            lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=True), ctx
        )
    if grad_q is not None:
        gq, gk, gv = (x.transpose(1, 2) for x in grad_q)
        dout = torch.randn_like(gq)

        def fwd_bwd():
            F.scaled_dot_product_attention(gq, gk, gv, is_causal=True).backward(dout)

        ctx = lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)  # noqa: E731
        entries["sdpa cudnn fwd+bwd"] = Entry(fwd_bwd, ctx)
    return entries


def _fork_entries(q, k, v, skipped):
    entries = {}
    if kernels.backend_available("triton"):
        from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton import (
            attention as triton_attention,
        )

        fn = lambda: kernels.attention_forward(q, k, v, backend="triton", **KW)  # noqa: E731
        entries["fork triton"] = Entry(fn)

        @contextlib.contextmanager
        def jit_launch():
            launcher = triton_attention._KERNEL
            saved, launcher.direct = launcher.direct, False
            try:
                yield
            finally:
                launcher.direct = saved

        entries["fork triton (JIT launch)"] = Entry(fn, jit_launch)
    else:
        skipped["fork triton"] = "Triton is not installed"
    if kernels.backend_available("cuda"):
        entries["fork cuda"] = Entry(
            lambda: kernels.attention_forward(q, k, v, backend="cuda", **KW)
        )
    else:
        skipped["fork cuda"] = (
            "the CUDA backend needs transformer_engine_exact_fp8 built with the sm_90a kernel"
            " and an sm90 GPU"
        )
    return entries


def _te_entries(shape, skipped):
    try:
        import transformer_engine.pytorch as te
        from transformer_engine.common import recipe
        from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.te import (
            status,
        )
    except Exception as err:  # upstream TE (the fork's build) is not importable here
        skipped["te"] = f"transformer_engine is not importable: {type(err).__name__}: {err}"
        return {}
    b, s, h, d = shape
    q, k, v = _inputs(shape, seed=1)
    qg, kg, vg = _inputs(shape, seed=1, grad=True)
    dout = torch.randn(b, s, h * d, device="cuda").bfloat16()
    entries = {}
    for path in ("bf16", "fork-current"):
        fp8 = path != "bf16"

        def autocast(fp8=fp8):
            rec = recipe.Float8CurrentScaling(fp8_dpa=True) if fp8 else None
            return te.autocast(enabled=fp8, recipe=rec)

        def check(fp8=fp8):
            if not fp8:
                return ""
            ran = status.status()
            return (
                f"mask-exact calls {ran.mask_exact_calls}, kernel backend {kernels.last_backend()}"
            )

        def module(train):
            dpa = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal").cuda()
            return dpa.train() if train else dpa.eval()

        dpa_eval, dpa_train = module(False), module(True)

        @contextlib.contextmanager
        def fwd_context(autocast=autocast):
            with torch.no_grad(), autocast():
                yield

        def fwd_bwd(dpa=dpa_train, autocast=autocast):
            with autocast():
                out = dpa(qg, kg, vg)
            out.backward(dout)

        entries[f"te {path}"] = Entry(lambda dpa=dpa_eval: dpa(q, k, v), fwd_context, check)
        entries[f"te {path} fwd+bwd"] = Entry(fwd_bwd, check=check)
    return entries


def part1(calls: int, repeats: int):
    skipped = {}
    q, k, v = _inputs(TINY)
    entries = {
        **_sdpa_entries(q, k, v, grad_q=_inputs(TINY, seed=2, grad=True)),
        **_fork_entries(q, k, v, skipped),
        **_te_entries(TINY, skipped),
    }
    runnable = {}
    for name, entry in entries.items():
        try:
            with entry.context():
                for _ in range(3):  # compile / build graphs and caches outside the timing
                    entry.fn()
            torch.cuda.synchronize()
        except Exception as err:  # a path this machine cannot run
            skipped[name] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        else:
            runnable[name] = entry
    wall = {name: [] for name in runnable}
    gpu = {name: [] for name in runnable}
    names = list(runnable)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            wall[name].append(host_us(runnable[name], calls))
            gpu[name].append(gpu_us(runnable[name]))
    rows = []
    for name in names:
        check = runnable[name].check
        rows.append(
            dict(
                entry=name,
                host_us=statistics.median(wall[name]),
                gpu_us=statistics.median(gpu[name]),
                note=check() if check else "",
            )
        )
    return rows, skipped


def part2(skipped):
    rows = {}
    q, k, v = _inputs(LARGE, seed=3)
    if kernels.backend_available("cuda"):
        from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.cuda import (
            attention as cuda_attention,
        )

        ops = cuda_attention.quantize_operands(q, k, v, qkv_format="bshd")
        out = torch.empty_like(q)
        lse = torch.empty(LARGE[2], LARGE[0] * LARGE[1], dtype=torch.float32, device="cuda")
        rows["cuda forward"] = gpu_ms_per_call(
            lambda: kernels.attention_forward(q, k, v, backend="cuda", **KW)
        )
        rows["cuda kernel"] = gpu_ms_per_call(
            lambda: cuda_attention.launch(ops, out, lse, True, LARGE[3] ** -0.5)
        )
        rows["cuda quantization"] = gpu_ms_per_call(
            lambda: cuda_attention.quantize_operands(q, k, v, qkv_format="bshd")
        )
        rows["cuda host gaps"] = (
            rows["cuda forward"] - rows["cuda kernel"] - rows["cuda quantization"]
        )
        forward = Entry(lambda: kernels.attention_forward(q, k, v, backend="cuda", **KW))
        rows["cuda forward queued"] = statistics.median(gpu_us(forward, 10) for _ in range(5)) / 1e3
    else:
        skipped["part 2 cuda"] = skipped.get("fork cuda", "the CUDA backend is not available")
    if kernels.backend_available("triton"):
        rows["triton forward"] = gpu_ms_per_call(
            lambda: kernels.attention_forward(q, k, v, backend="triton", **KW)
        )
    return rows


def markdown(rows, large, skipped, calls, repeats) -> str:
    b, s, h, d = TINY
    base = next((r["host_us"] for r in rows if r["entry"] == "sdpa cudnn"), None)
    lines = [
        f"Host time per call, b={b} s={s} h={h} d={d} causal bf16 ({torch.cuda.get_device_name()},"
        f" torch {torch.__version__}): {calls} calls back to back, synchronize only around the"
        f" loop, median of {repeats} round-robin repeats; gpu us/call: {GPU_CALLS} calls queued"
        " behind a sleep kernel (no host gaps), CUDA events. A row is host-bound where host >"
        " gpu.",
        "",
        "| entry | host us/call | gpu us/call | x sdpa cudnn | note |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r['host_us'] / base:.2f}x" if base else "-"
        lines.append(
            f"| {r['entry']} | {r['host_us']:.1f} | {r['gpu_us']:.1f} | {ratio} | {r['note']} |"
        )
    verdicts = []
    if base:
        for name in ("fork triton", "fork cuda", "te fork-current"):
            r = next((x for x in rows if x["entry"] == name), None)
            if r:
                ok = r["host_us"] <= TARGET_RATIO * base
                verdicts.append(f"{name} {r['host_us'] / base:.2f}x ({'met' if ok else 'MISSED'})")
    if verdicts:
        lines += ["", f"Target host time <= {TARGET_RATIO}x sdpa cudnn: " + ", ".join(verdicts)]
    if large:
        b, s, h, d = LARGE
        lines += [
            "",
            f"GPU time at b={b} s={s} h={h} d={d} causal (CUDA events around one call, median of"
            " 25): " + ", ".join(f"{k} {v:.3f} ms" for k, v in large.items()),
        ]
    if skipped:
        lines += ["", "Skipped: " + "; ".join(f"{k}: {v}" for k, v in skipped.items())]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--skip-large", action="store_true", help="skip part 2 (s = 8k)")
    args = parser.parse_args()
    if args.calls < 1 or args.repeats < 1:
        parser.error("--calls and --repeats must be >= 1")
    if not torch.cuda.is_available():
        print("no CUDA device: this benchmark runs on a GPU")
        return 1
    rows, skipped = part1(args.calls, args.repeats)
    large = {} if args.skip_large else part2(skipped)
    table = markdown(rows, large, skipped, args.calls, args.repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_time.md").write_text(table)
    payload = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        tiny_shape=TINY,
        large_shape=LARGE,
        calls=args.calls,
        repeats=args.repeats,
        rows=rows,
        large_ms=large,
        skipped=skipped,
    )
    (args.out / "host_time.json").write_text(json.dumps(payload, indent=2))
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
