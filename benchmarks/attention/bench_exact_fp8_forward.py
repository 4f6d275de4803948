"""Mask-exact FP8 attention forward on the GPU: accuracy and speed tables, one run.

    python benchmarks/attention/bench_exact_fp8_forward.py --accuracy --speed --out DIR

Accuracy (--accuracy): causal bshd, b=1, h=2, d=128, bf16, N(0,1) inputs with 0.1% outliers x50,
s = 1k..16k. Errors (relative Frobenius, cosine) against an fp64 reference on a fixed subset of
query rows (all heads; the fp64 reference of all rows would need s x s fp64 scores): the kernel
(both recipes, and the leaky fp8_v_everywhere mode), upstream's rules emulated in fp64 with an
exact P (current scaling: one amax over concat(Q, K, V), as reference_attention('upstream-current');
MXFP8: the same E8M0 blocks as the fork with every V in FP8, as 'upstream-mxfp8') and torch's BF16
scaled_dot_product_attention. Each recipe's error is judged against upstream's current-scaling
rule (the issue's target) and MXFP8's also against upstream's MXFP8 rule.

Speed (--speed): causal bshd, d=128, bf16, (b, h, s) = (4, 16, 4k), (2, 16, 8k), (1, 16, 16k).
The kernel INCLUDING the K/V quantization (Q is quantized inside the kernel), next to torch BF16
SDPA (cuDNN and flash backends, best of both) and the leaky all-FP8 lower bound. Also the kernel
alone, the K/V quantization alone, the kernel (exact and leaky) with the boundary sub-tile
widths in BOUNDARY_ABLATION instead of attention_kernel.BOUNDARY_N, and the exact forward on
s - 8 keys per sample (sequence starts off the 16-token grid: V8^T is laid out again).
The host time per call (CPU microseconds, launches back to back at b=1, s=128, h=1) of the exact
forward and of cuDNN's SDPA: the floor of a call where the GPU work is too small to hide it.
FLOPs (causal) = 2*b*h*s*s*d. Timing: triton.testing.do_bench medians, taken round-robin over all
entries --rounds times (each entry sees the same clocks and power state); the table shows the
median over rounds. Peak extra memory: torch.cuda.max_memory_allocated during one call, minus
what was allocated before it (inputs excluded).

Writes DIR/attention_accuracy.md, DIR/attention_forward.md and DIR/bench_exact_fp8.json.
"""

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton import (
    attention,
)  # noqa: E402
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import (
    quantize,
)  # noqa: E402
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.formats import (  # noqa: E402,E501
    V_CHUNK_CURRENT,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import (  # noqa: E402,E501
    SeqLayout,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.attention import (  # noqa: E402,E501
    dequantized_operands,
    reference_attention,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.sequences import (  # noqa: E402,E501
    sequences,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (  # noqa: E402,E501
    cosine_similarity,
    host_us_per_call,
    rel_frobenius_error,
)

SPEED_SHAPES = ((4, 16, 4096), (2, 16, 8192), (1, 16, 16384))
ACCURACY_SEQLENS = (1024, 2048, 4096, 8192, 16384)
HEAD_DIM = 128
HOST_SHAPE = (1, 128, 1, HEAD_DIM)  # bshd: small enough that the host, not the GPU, sets the pace
BOUNDARY_ABLATION = (128,)  # boundary sub-tile widths timed next to the default (kernel alone)
TARGET_SPEEDUP = 1.3  # vs the best BF16 SDPA at s >= 8k, quantization included
TARGET_EXACT_COST = 0.05  # exact vs leaky all-FP8 at 8k
TARGET_COSINE = 0.9985
MEMORY_ENTRIES = (
    "sdpa cudnn",
    "sdpa flash",
    "exact current",
    "exact mxfp8",
    "kernel exact current",
)


def _inputs(shape, seed, outlier_frac=0.0):
    """bf16 N(0, 1) tensors of `shape` on the GPU, with x50 outliers at a random fraction."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for _ in range(3):
        x = torch.randn(*shape, device="cuda", generator=gen)
        if outlier_frac:
            spikes = torch.rand(*shape, device="cuda", generator=gen) < outlier_frac
            x = torch.where(spikes, 50 * x, x)
        out.append(x.bfloat16())
    return out


# ---------------------------------------------------------------------------- accuracy


def fp64_causal_rows(q, k, v, rows):
    """fp64 causal attention of the query rows `rows` (bshd, b = 1): [len(rows), h, d]."""
    qh = q[0, rows].double().transpose(0, 1)  # [h, r, d]
    kh, vh = (x[0].double().transpose(0, 1) for x in (k, v))  # [h, s, d]
    scores = qh @ kh.transpose(1, 2) * q.shape[-1] ** -0.5
    cols = torch.arange(k.shape[1], device=q.device)
    scores = scores.masked_fill(cols.view(1, 1, -1) > rows.view(1, -1, 1), float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vh).transpose(0, 1)


def _check_fp64_rows_against_reference():
    """The row-subset fp64 attention is reference_attention('bf16') in fp64 on those rows."""
    q, k, v = _inputs((1, 512, 2, HEAD_DIM), seed=1, outlier_frac=1e-3)
    rows = torch.tensor([0, 5, 127, 128, 300, 511], device="cuda")
    ref = reference_attention("bf16", *(x.cpu().double() for x in (q, k, v)))
    got = fp64_causal_rows(q, k, v, rows).cpu()
    torch.testing.assert_close(got, ref.out[0, rows.cpu()], rtol=1e-12, atol=1e-12)


def _fork_current_dequantized(q, k, v):
    """q, k, v (bshd, b = 1) after the fork's current-scaling rules, dequantized to fp64."""
    s = q.shape[1]
    q8, q_inv = quantize.per_token_cast_to_fp8(q, qkv_format="bshd")  # [h, t, d], [h, t]
    k8, k_inv = quantize.per_token_cast_to_fp8(k, qkv_format="bshd")
    v8t, v_inv, _ = quantize.per_chunk_cast_to_fp8_transposed(v, qkv_format="bshd")  # [h, n]
    per_token = v_inv.double().repeat_interleave(V_CHUNK_CURRENT, dim=1)[:, :s, None]  # [h, t, 1]
    out = [
        (q8.double() * q_inv.double()[..., None]),
        (k8.double() * k_inv.double()[..., None]),
        (v8t[:, :, :s].double().transpose(1, 2) * per_token),
    ]
    return [x.transpose(0, 1).unsqueeze(0) for x in out]  # [1, s, h, d]


def _upstream_dequantized(path, q, k, v):
    """q, k, v (bshd, b = 1) under upstream's rules of `path` ("upstream-current": one amax over
    concat(Q, K, V); "upstream-mxfp8": E8M0 per 32 channels of Q and K, per 32 tokens and channel
    of V), every V in FP8, dequantized to fp64 on q's device: [1, s, h, d] each."""
    operands = dequantized_operands(
        path, *(x[0].cpu() for x in (q, k, v)), SeqLayout.dense(1, q.shape[1])
    )
    return [x.unsqueeze(0).to(q.device) for x in operands]


def _query_rows(s, gen):
    """A fixed spread of query rows: the first and last tiles, and random rows in between."""
    n_random = min(512, s // 2)
    rand = torch.randperm(s - 256, generator=gen)[:n_random] + 128
    return torch.cat([torch.arange(64), rand.sort().values, torch.arange(s - 128, s)]).cuda()


def accuracy_table(out_dir: Path):
    _check_fp64_rows_against_reference()
    rows_out, results = [], {}
    for s in ACCURACY_SEQLENS:
        q, k, v = _inputs((1, s, 2, HEAD_DIM), seed=s, outlier_frac=1e-3)
        rows = _query_rows(s, torch.Generator().manual_seed(s))
        truth = fp64_causal_rows(q, k, v, rows)
        upstream = fp64_causal_rows(*_upstream_dequantized("upstream-current", q, k, v), rows)
        upstream_mx = fp64_causal_rows(*_upstream_dequantized("upstream-mxfp8", q, k, v), rows)
        fork_q, fork_k, fork_v = _fork_current_dequantized(q, k, v)
        rules_qk = fp64_causal_rows(fork_q, fork_k, v, rows)
        rules_qkv = fp64_causal_rows(fork_q, fork_k, fork_v, rows)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
            sdpa = F.scaled_dot_product_attention(
                *(x.transpose(1, 2) for x in (q, k, v)), is_causal=True
            ).transpose(1, 2)
        entries = {
            "exact current": attention.exact_fp8_attention_forward(q, k, v, recipe="current")[0],
            "exact mxfp8": attention.exact_fp8_attention_forward(q, k, v, recipe="mxfp8")[0],
            "leaky all-FP8 current": attention.exact_fp8_attention_forward(
                q, k, v, recipe="current", fp8_v_everywhere=True
            )[0],
            "upstream current (emulated, fp64)": upstream.unsqueeze(0),
            "upstream mxfp8 (emulated, fp64)": upstream_mx.unsqueeze(0),
            "fork rules, Q.K^T only (fp64)": rules_qk.unsqueeze(0),
            "fork rules, Q, K, V (fp64, P exact)": rules_qkv.unsqueeze(0),
            "torch BF16 SDPA": sdpa,
        }
        results[s] = {}
        for name, out in entries.items():
            sub = out[0] if "fp64" in name else out[0, rows]
            err, cos = rel_frobenius_error(sub, truth), cosine_similarity(sub, truth)
            results[s][name] = {"rel_err": err, "cosine": cos}
            rows_out.append(f"| {s} | {name} | {err:.3e} | {cos:.6f} |")
        del q, k, v, truth, upstream, upstream_mx, rules_qk, rules_qkv, sdpa, entries
        torch.cuda.empty_cache()
    lines = [
        "rows compared per s: the first 64, the last 128 and up to 512 random rows, 2 heads",
        "",
        "| s | path | rel. Frobenius error | cosine |",
        "|---|---|---|---|",
        *rows_out,
        "",
        ACCURACY_NOTE,
        "",
        _accuracy_verdict(results),
    ]
    text = "\n".join(lines)
    (out_dir / "attention_accuracy.md").write_text(text + "\n")
    return results, text


ACCURACY_NOTE = (
    "The two 'fork rules' rows apply the fork's current-scaling rules in fp64 (no kernel): "
    "E4M3 Q.K^T alone already carries most of the error with x50 outliers, so the cosine "
    f"target ({TARGET_COSINE}) is out of reach of the format itself, whatever the kernel does."
)


def _accuracy_verdict(results):
    worse = [
        f"s={s} {recipe}"
        for s, r in results.items()
        for recipe in ("exact current", "exact mxfp8")
        if r[recipe]["rel_err"] > r["upstream current (emulated, fp64)"]["rel_err"]
    ]
    worse_mx = [
        f"s={s}"
        for s, r in results.items()
        if r["exact mxfp8"]["rel_err"] > r["upstream mxfp8 (emulated, fp64)"]["rel_err"]
    ]
    low_cos = [
        f"s={s} {p}"
        for s, r in results.items()
        for p in ("exact current", "exact mxfp8")
        if r[p]["cosine"] < TARGET_COSINE
    ]
    return (
        f"targets: error <= upstream's current scaling: "
        f"{'met' if not worse else 'MISSED ' + ', '.join(worse)}; "
        f"exact mxfp8 error <= upstream's MXFP8 rule: "
        f"{'met' if not worse_mx else 'MISSED ' + ', '.join(worse_mx)}; "
        f"cosine >= {TARGET_COSINE}: {'met' if not low_cos else 'MISSED ' + ', '.join(low_cos)}"
    )


# ---------------------------------------------------------------------------- speed


def _sdpa(q, k, v, backend):
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))

    def run():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)

    return run


def _exact_parts(q, k, v, recipe, leaky=False):
    """(full forward incl. quantization, K/V quantization alone, kernel alone (boundary_n))."""
    seqs = sequences(q, k, "bshd", "causal", None, None, None, None, None)

    def quant():
        return (
            attention._quantize_k(k, "bshd", recipe, False, 0.0),
            attention._quantize_v(v, "bshd", seqs, recipe, False, 0.0),
        )

    k_fp8, v_fp8 = quant()

    def kernel(boundary_n=attention.BOUNDARY_N):
        return attention._launch(
            q, None, k_fp8, v_fp8, v, seqs, "bshd", recipe, "causal", None,
            q.shape[-1] ** -0.5, False, 0.0, leaky, boundary_n=boundary_n,
        )  # fmt: skip

    def full():
        return attention.exact_fp8_attention_forward(q, k, v, recipe=recipe, fp8_v_everywhere=leaky)

    return full, quant, kernel


def _peak_extra_mb(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak / 2**20


def _entries(q, k, v):
    full_c, quant_c, kernel_c = _exact_parts(q, k, v, "current")
    full_l, _, kernel_l = _exact_parts(q, k, v, "current", leaky=True)
    full_m, quant_m, kernel_m = _exact_parts(q, k, v, "mxfp8")
    entries = {
        "sdpa cudnn": _sdpa(q, k, v, SDPBackend.CUDNN_ATTENTION),
        "sdpa flash": _sdpa(q, k, v, SDPBackend.FLASH_ATTENTION),
        "exact current": full_c,
        "leaky current": full_l,
        "exact mxfp8": full_m,
        "kernel exact current": kernel_c,
        "kernel leaky current": kernel_l,
        "kernel exact mxfp8": kernel_m,
        "quant k,v current": quant_c,
        "quant k,v mxfp8": quant_m,
    }
    for n in BOUNDARY_ABLATION:
        entries[f"kernel exact current b{n}"] = lambda n=n: kernel_c(n)
        entries[f"kernel leaky current b{n}"] = lambda n=n: kernel_l(n)
    # s - 8 keys per sample: sequence starts off the 16-token grid, so V8^T is laid out again
    full_u, quant_u, kernel_u = _exact_parts(*(x[:, :-8] for x in (q, k, v)), "current")
    entries.update({"exact current s-8": full_u, "quant k,v current s-8": quant_u})
    entries["kernel exact current s-8"] = kernel_u
    return entries


def round_robin(entries, rounds):
    """Median ms of each entry over `rounds` rounds, the order rotated every round."""
    times = {name: [] for name in entries}
    names = list(entries)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(
                triton.testing.do_bench(entries[name], warmup=10, rep=40, return_mode="median")
            )
    return {name: statistics.median(t) for name, t in times.items()}


WITH_QUANTIZATION = (
    "exact current",
    "leaky current",
    "exact mxfp8",
    "quant k,v current",
    "quant k,v mxfp8",
    "exact current s-8",
    "quant k,v current s-8",
)


def _exactness_cost(ms):
    """Kernel alone, exact over the fastest leaky all-FP8 variant (any boundary width), - 1."""
    leaky = min(t for name, t in ms.items() if name.startswith("kernel leaky current"))
    return ms["kernel exact current"] / leaky - 1


def _wall_ms(fn):
    """One call's wall time: for the CPU quantization fallback, too slow for do_bench."""
    torch.cuda.synchronize()
    start = datetime.datetime.now()
    fn()
    torch.cuda.synchronize()
    return (datetime.datetime.now() - start).total_seconds() * 1e3


def host_overhead(calls=200):
    """Host microseconds per call at a tiny shape (HOST_SHAPE), median of three repeats."""
    q, k, v = _inputs(HOST_SHAPE, seed=0)
    fns = {
        "exact current": lambda: attention.exact_fp8_attention_forward(q, k, v, recipe="current"),
        "sdpa cudnn": _sdpa(q, k, v, SDPBackend.CUDNN_ATTENTION),
    }
    return {n: host_us_per_call(f, calls) for n, f in fns.items()}


def speed_table(out_dir: Path, rounds: int):
    results = {}
    for b, h, s in SPEED_SHAPES:
        q, k, v = _inputs((b, s, h, HEAD_DIM), seed=s)
        entries = _entries(q, k, v)
        for fn in entries.values():  # compile, and catch failures before timing
            fn()
        slow = (
            {} if quantize.extension_available() else {n: entries.pop(n) for n in WITH_QUANTIZATION}
        )
        ms = round_robin(entries, rounds)
        ms.update({n: _wall_ms(fn) for n, fn in slow.items()})
        memory = {n: _peak_extra_mb(fn) for n, fn in entries.items() if n in MEMORY_ENTRIES}
        results[f"{b}x{h}x{s}"] = {"ms": ms, "peak_extra_mb": memory}
        del q, k, v, entries, slow
        torch.cuda.empty_cache()
    host = host_overhead()
    text = _speed_markdown(results, rounds) + "\n\n" + _host_markdown(host)
    (out_dir / "attention_forward.md").write_text(text + "\n")
    return {"shapes": results, "host_us_per_call": host}, text


def _host_markdown(host):
    b, s, h, d = HOST_SHAPE
    return (
        f"host time per call at b={b}, s={s}, h={h}, d={d} (launches back to back, median of 3): "
        + ", ".join(f"{n} {us:.0f} us" for n, us in host.items())
    )


def _speed_markdown(results, rounds):
    cols = ("sdpa cudnn", "sdpa flash", "exact current", "leaky current", "exact mxfp8")
    lines = [
        f"causal bshd d={HEAD_DIM} bf16; TFLOPS (ms); FLOPs = 2*b*h*s*s*d; median of {rounds} "
        "round-robin rounds of do_bench medians; exact/leaky include the K/V quantization "
        f"({'CUDA extension' if quantize.extension_available() else 'torch fallback on the CPU'}); "
        "exactness cost: the exact kernel alone over the fastest leaky all-FP8 kernel",
        "",
        "| b,h,s | " + " | ".join(cols) + " | speed-up vs best BF16 | exactness cost |",
        "|---|" + "---|" * (len(cols) + 2),
    ]
    for shape, r in results.items():
        b, h, s = (int(x) for x in shape.split("x"))
        flops = 2.0 * b * h * s * s * HEAD_DIM
        ms = r["ms"]
        cells = [f"{flops / ms[c] / 1e9:.0f} ({ms[c]:.3f})" for c in cols]
        bf16 = min(ms["sdpa cudnn"], ms["sdpa flash"])
        cost = _exactness_cost(ms)
        lines.append(
            f"| {b},{h},{s} | " + " | ".join(cells)
            + f" | {bf16 / ms['exact current']:.2f}x | {100 * cost:+.1f}% |"
        )  # fmt: skip
    lines += ["", "kernel alone and quantization alone, ms:", ""]
    parts = [n for n in next(iter(results.values()))["ms"] if n.startswith(("kernel", "quant"))]
    lines += ["| b,h,s | " + " | ".join(parts) + " |", "|---|" + "---|" * len(parts)]
    for shape, r in results.items():
        lines.append(f"| {shape} | " + " | ".join(f"{r['ms'][n]:.3f}" for n in parts) + " |")
    lines += ["", "peak extra memory during one call, MiB:", ""]
    mem_cols = list(next(iter(results.values()))["peak_extra_mb"])
    lines += ["| b,h,s | " + " | ".join(mem_cols) + " |", "|---|" + "---|" * len(mem_cols)]
    for shape, r in results.items():
        mem = r["peak_extra_mb"]
        lines.append(f"| {shape} | " + " | ".join(f"{mem[c]:.0f}" for c in mem_cols) + " |")
    lines += ["", _speed_verdict(results)]
    return "\n".join(lines)


def _speed_verdict(results):
    out = []
    for shape, r in results.items():
        s = int(shape.split("x")[2])
        ms = r["ms"]
        speedup = min(ms["sdpa cudnn"], ms["sdpa flash"]) / ms["exact current"]
        if s >= 8192:
            ok = "met" if speedup >= TARGET_SPEEDUP else "MISSED"
            out.append(f"s={s}: {speedup:.2f}x vs BF16 (target {TARGET_SPEEDUP}x) {ok}")
        if s == 8192:
            cost = _exactness_cost(ms)
            ok = "met" if cost <= TARGET_EXACT_COST else "MISSED"
            out.append(f"s={s}: exactness cost {100 * cost:+.1f}% (target <= 5%) {ok}")
    return "targets: " + "; ".join(out)


def environment() -> str:
    """One line: date and time (UTC), GPU, versions, and whether the extension is built."""
    props = torch.cuda.get_device_properties(0)
    return (
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {props.name}"
        f" ({props.multi_processor_count} SMs), torch {torch.__version__}, triton"
        f" {triton.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()},"
        f" quantization extension {'built' if quantize.extension_available() else 'NOT built'}"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accuracy", action="store_true")
    parser.add_argument("--speed", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment()
    print(env)
    report = {"environment": env}
    texts = []
    if args.accuracy:
        report["accuracy"], text = accuracy_table(args.out)
        texts.append("ACCURACY\n" + text)
    if args.speed:
        report["speed"], text = speed_table(args.out, args.rounds)
        texts.append("SPEED\n" + text)
    (args.out / "bench_exact_fp8.json").write_text(json.dumps(report, indent=1, default=str))
    print("\n\n".join(texts))


if __name__ == "__main__":
    main()
