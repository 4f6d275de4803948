"""Rules v2 (one V scale per chunk and kv-head) against v1 (per chunk and channel), one run.

    python benchmarks/attention/bench_v_scale_rules.py --accuracy --speed [--baseline DIR] --out DIR

--baseline DIR: a copy of the v1 code (`git archive <commit>` of transformer_engine/, build_tools/
and CMakeLists.txt) whose quantization extension is built, renamed transformer_engine_exact_fp8_v1,
in DIR/build/lib (tools/gpu_v_scale_check.sh does both). Its exact_fp8 package is imported under
the name exact_fp8_v1, next to this checkout's, so that both kernels run in the same process, on
the same inputs and clocks.

Accuracy (--accuracy): causal bshd, b=1, h=2, d=128, bf16, s in ACCURACY_SEQLENS, three input
families (FAMILIES). Errors against an fp64 attention of the unquantized inputs on a fixed subset
of query rows (the first 64, the last 128 and 512 random ones, every head): torch's BF16 SDPA,
upstream's one-amax rule, v1 and v2 emulated in fp64 (reference.attention.dequantized_operands:
every V in FP8, P exact), the v2 kernel and, with --baseline, the v1 kernel. RMSE, relative
Frobenius error and cosine.

Speed (--speed): causal bshd, b=2, h=16, d=128, bf16, s in SPEED_SEQLENS: the forward including
the K/V quantization (Q is quantized inside the kernel) of v2 with each launch configuration of
LAUNCH_SWEEP, of v1 with its own table, both recipes, next to torch's BF16 SDPA (cuDNN and flash
backends); the kernels alone and the K/V quantization alone. triton.testing.do_bench medians,
taken round-robin over all entries --rounds times; the table shows the median over rounds.

Writes DIR/v_scale_rules.md and DIR/v_scale_rules.json.
"""

import argparse
import importlib
import importlib.util
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_exact_fp8_forward import (  # noqa: E402
    _query_rows,
    environment,
    fp64_causal_rows,
    round_robin,
)

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import (  # noqa: E402,E501
    SeqLayout,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.attention import (  # noqa: E402,E501
    dequantized_operands,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.sequences import (  # noqa: E402,E501
    sequences,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (  # noqa: E402,E501
    error_metrics,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton import (  # noqa: E402,E501
    attention,
)

HEAD_DIM = 128
ACCURACY_SEQLENS = (1024, 4096, 16384)
SPEED_SEQLENS = (4096, 8192, 16384)
SPEED_BATCH, SPEED_HEADS = 2, 16
K_OUTLIER_CHANNELS = (3, 17, 64, 101)
# (block_m, num_warps, num_stages, maxnreg): launch parameters only (no output bit changes)
LAUNCH_SWEEP = (
    (64, 4, 3, None),
    (64, 4, 2, None),
    (64, 4, 4, None),
    (128, 8, 2, None),
    (128, 8, 3, None),
)
BASELINE_EXTENSION = "transformer_engine_exact_fp8_v1"
TARGET_V2_VS_V1_ERROR = 1.05  # v2's error at most 5% above v1's
TARGET_SPEEDUP_V1 = 1.08
TARGET_VS_BF16_8K = 0.95
PV1 = "v1 rule per (chunk, channel) (reference, fp64)"
PV2 = "v2 rule per (chunk, kv-head) (reference, fp64)"
UPSTREAM = "upstream one-amax rule (reference, fp64)"
KERNEL_V2 = "v2 kernel"
KERNEL_V1 = "v1 kernel"
SDPA = "BF16 (torch SDPA)"


# ---------------------------------------------------------------------------- the v1 package


def load_baseline(root: Path):
    """The baseline's exact_fp8 package, imported as exact_fp8_v1, with its own extension.

    Both extensions cannot share one module name in a process, so the baseline's is built as
    transformer_engine_exact_fp8_v1 (tools/gpu_v_scale_check.sh renames it in the copy)."""
    sys.path.insert(0, str(root / "build" / "lib"))
    pkg_dir = root / "transformer_engine/pytorch/attention/dot_product_attention/exact_fp8"
    spec = importlib.util.spec_from_file_location(
        "exact_fp8_v1", pkg_dir / "__init__.py", submodule_search_locations=[str(pkg_dir)]
    )
    pkg = importlib.util.module_from_spec(spec)
    sys.modules["exact_fp8_v1"] = pkg
    spec.loader.exec_module(pkg)
    v1_attention = importlib.import_module("exact_fp8_v1.triton.attention")
    ext = importlib.import_module("exact_fp8_v1.quantize")._ext
    if ext is None or ext.__name__ != BASELINE_EXTENSION:
        raise ImportError(f"the baseline's extension {BASELINE_EXTENSION} did not load: {ext}")
    return v1_attention


# ---------------------------------------------------------------------------- accuracy


def _family_inputs(family: str, s: int, seed: int):
    """bf16 q, k, v [1, s, 2, d] on the GPU for one input family (FAMILIES)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (1, s, 2, HEAD_DIM)
    q, k, v = (torch.randn(*shape, device="cuda", generator=gen) for _ in range(3))
    if family == "k-channels-x20":
        k[..., list(K_OUTLIER_CHANNELS)] *= 20
        return [x.bfloat16() for x in (q, k, v)]
    out = []
    for x in (q, k, v):
        spikes = torch.rand(*shape, device="cuda", generator=gen) < 1e-3
        if family == "outliers-x50":
            x = torch.where(spikes, 50 * x, x)
        else:  # entries drawn from N(0, 10^2)
            x = torch.where(spikes, 10 * torch.randn(*shape, device="cuda", generator=gen), x)
        out.append(x.bfloat16())
    return out


FAMILIES = {
    "outliers-N(0,100)": "N(0,1), 0.1% of the entries of Q, K, V drawn from N(0, 10^2)",
    "outliers-x50": "N(0,1), 0.1% of the entries of Q, K, V multiplied by 50",
    "k-channels-x20": f"N(0,1), K channels {list(K_OUTLIER_CHANNELS)} multiplied by 20",
}


def _emulated(path, q, k, v, rows):
    """fp64 attention of `rows` over the dequantized operands of reference path `path`."""
    layout = SeqLayout.dense(1, q.shape[1])
    operands = dequantized_operands(path, *(x[0].cpu() for x in (q, k, v)), layout)
    return fp64_causal_rows(*(x.unsqueeze(0).to(q.device) for x in operands), rows)


def accuracy(v1_attention):
    results = {}
    for family in FAMILIES:
        for s in ACCURACY_SEQLENS:
            q, k, v = _family_inputs(family, s, seed=s)
            rows = _query_rows(s, torch.Generator().manual_seed(s))
            truth = fp64_causal_rows(q, k, v, rows)
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
                sdpa = F.scaled_dot_product_attention(
                    *(x.transpose(1, 2) for x in (q, k, v)), is_causal=True
                ).transpose(1, 2)
            entries = {
                SDPA: sdpa[0, rows],
                UPSTREAM: _emulated("upstream-current", q, k, v, rows),
                PV1: _emulated("fork-current-v1", q, k, v, rows),
                PV2: _emulated("fork-current", q, k, v, rows),
                KERNEL_V2: attention.exact_fp8_attention_forward(q, k, v, recipe="current")[0][
                    0, rows
                ],
            }
            if v1_attention is not None:
                out = v1_attention.exact_fp8_attention_forward(q, k, v, recipe="current")[0]
                entries[KERNEL_V1] = out[0, rows]
            results[f"{family} {s}"] = {n: error_metrics(o, truth) for n, o in entries.items()}
            del q, k, v, truth, sdpa, entries
            torch.cuda.empty_cache()
    return results


def _accuracy_markdown(results):
    lines = [
        "| family | s | path | RMSE | rel. Frobenius error | cosine |",
        "|---|---|---|---|---|---|",
    ]
    for key, r in results.items():
        family, s = key.rsplit(" ", 1)
        for name, m in r.items():
            lines.append(
                f"| {family} | {s} | {name} | {m['rmse']:.3e} | {m['rel_err']:.3e} |"
                f" {m['cosine']:.6f} |"
            )
    return "\n".join(lines + ["", _accuracy_verdict(results)])


def _accuracy_verdict(results):
    checks = {
        "v2 kernel <= 1.05 x v1 rule": (KERNEL_V2, PV1, TARGET_V2_VS_V1_ERROR),
        "v2 rule <= 1.05 x v1 rule (both fp64)": (PV2, PV1, TARGET_V2_VS_V1_ERROR),
        "v2 kernel < upstream": (KERNEL_V2, UPSTREAM, 1.0),
    }
    if any(KERNEL_V1 in r for r in results.values()):
        checks["v2 kernel <= 1.05 x v1 kernel"] = (KERNEL_V2, KERNEL_V1, TARGET_V2_VS_V1_ERROR)
    out = []
    for label, (a, b, factor) in checks.items():
        missed = [k for k, r in results.items() if r[a]["rel_err"] > factor * r[b]["rel_err"]]
        out.append(f"{label}: " + ("met" if not missed else "MISSED at " + ", ".join(missed)))
    return "targets (relative Frobenius error): " + "; ".join(out)


# ---------------------------------------------------------------------------- speed


def _sdpa(q, k, v, backend):
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))

    def run():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)

    return run


def _v2_parts(q, k, v, recipe, config):
    """(forward incl. K/V quantization with launch `config`, kernel alone, quantization alone)."""
    seqs = sequences(q, k, "bshd", "causal", None, None, None, None, None)

    def quant():
        return (
            attention._quantize_k(k, "bshd", recipe, False, 0.0),
            attention._quantize_v(v, "bshd", seqs, recipe, False, 0.0),
        )

    def launch(k_fp8, v_fp8):
        return attention._launch(
            q, None, k_fp8, v_fp8, v, seqs, "bshd", recipe, "causal", None,
            q.shape[-1] ** -0.5, False, 0.0, False, launch_config=config,
        )  # fmt: skip

    ready = quant()
    return (lambda: launch(*quant())), (lambda: launch(*ready)), quant


def _v1_parts(v1_attention, q, k, v, recipe):
    seqs = v1_attention._sequences(q, k, "bshd", "causal", None, None, None, None, None)

    def quant():
        return (
            v1_attention._quantize_k(k, "bshd", recipe, False, 0.0),
            v1_attention._quantize_v(v, "bshd", seqs, recipe, False, 0.0),
        )

    k_fp8, v_fp8 = quant()

    def kernel():
        return v1_attention._launch(
            q, None, k_fp8, v_fp8, v, seqs, "bshd", recipe, "causal", None,
            q.shape[-1] ** -0.5, False, 0.0, False,
        )  # fmt: skip

    def full():
        return v1_attention.exact_fp8_attention_forward(q, k, v, recipe=recipe)

    return full, kernel, quant


def _config_name(config):
    block_m, warps, stages, maxnreg = config
    return f"m{block_m}w{warps}s{stages}" + (f"r{maxnreg}" if maxnreg else "")


def _entries(q, k, v, v1_attention):
    entries = {
        "sdpa cudnn": _sdpa(q, k, v, SDPBackend.CUDNN_ATTENTION),
        "sdpa flash": _sdpa(q, k, v, SDPBackend.FLASH_ATTENTION),
    }
    for config in LAUNCH_SWEEP:
        full, kernel, quant = _v2_parts(q, k, v, "current", config)
        entries[f"v2 current {_config_name(config)}"] = full
        entries[f"v2 kernel current {_config_name(config)}"] = kernel
    entries["v2 quant k,v current"] = quant
    full, kernel, _ = _v2_parts(q, k, v, "mxfp8", attention._LAUNCH_CONFIG[("mxfp8", HEAD_DIM)])
    entries["v2 mxfp8"], entries["v2 kernel mxfp8"] = full, kernel
    if v1_attention is not None:
        for recipe in ("current", "mxfp8"):
            full, kernel, quant = _v1_parts(v1_attention, q, k, v, recipe)
            entries[f"v1 {recipe}"], entries[f"v1 kernel {recipe}"] = full, kernel
            if recipe == "current":
                entries["v1 quant k,v current"] = quant
    return entries


def speed(v1_attention, rounds):
    results = {}
    for s in SPEED_SEQLENS:
        q, k, v = (
            torch.randn(SPEED_BATCH, s, SPEED_HEADS, HEAD_DIM, device="cuda").bfloat16()
            for _ in range(3)
        )
        entries = _entries(q, k, v, v1_attention)
        for fn in entries.values():  # compile, and catch failures before timing
            fn()
        results[s] = round_robin(entries, rounds)
        del q, k, v, entries
        torch.cuda.empty_cache()
    return results


def best_config(results):
    """The v2 launch configuration with the least total forward time over SPEED_SEQLENS."""
    totals = {
        config: sum(ms[f"v2 current {_config_name(config)}"] for ms in results.values())
        for config in LAUNCH_SWEEP
    }
    return min(totals, key=totals.get)


def _speed_markdown(results, best):
    best_name = f"v2 current {_config_name(best)}"
    head = ["sdpa cudnn", "sdpa flash", best_name, "v1 current", "v2 mxfp8", "v1 mxfp8"]
    lines = [
        f"causal bshd b={SPEED_BATCH} h={SPEED_HEADS} d={HEAD_DIM} bf16; TFLOPS (ms); FLOPs ="
        " 2*b*h*s*s*d; forward including the K/V quantization; best v2 configuration:"
        f" {_config_name(best)} (least total time over the shapes)",
        "",
        "| s | " + " | ".join(head) + " | v2/v1 | v2/best BF16 | v2 mxfp8/v1 mxfp8 |",
        "|---|" + "---|" * (len(head) + 3),
    ]
    for s, ms in results.items():
        flops = 2.0 * SPEED_BATCH * SPEED_HEADS * s * s * HEAD_DIM
        cells = [f"{flops / ms[c] / 1e9:.0f} ({ms[c]:.3f})" if c in ms else "-" for c in head]
        bf16 = min(ms["sdpa cudnn"], ms["sdpa flash"])
        v1 = f"{ms['v1 current'] / ms[best_name]:.3f}x" if "v1 current" in ms else "-"
        mx = f"{ms['v1 mxfp8'] / ms['v2 mxfp8']:.3f}x" if "v1 mxfp8" in ms else "-"
        lines.append(
            f"| {s} | " + " | ".join(cells) + f" | {v1} | {bf16 / ms[best_name]:.3f}x | {mx} |"
        )
    names = [n for n in next(iter(results.values())) if n not in head]
    lines += ["", "every entry, ms:", "", "| entry | " + " | ".join(map(str, results)) + " |"]
    lines.append("|---|" + "---|" * len(results))
    for n in names:
        lines.append(f"| {n} | " + " | ".join(f"{ms[n]:.3f}" for ms in results.values()) + " |")
    return "\n".join(lines + ["", _speed_verdict(results, best_name)])


def _speed_verdict(results, best_name):
    out = []
    for s, ms in results.items():
        if "v1 current" in ms:
            ratio = ms["v1 current"] / ms[best_name]
            ok = "met" if ratio >= TARGET_SPEEDUP_V1 else "MISSED"
            out.append(f"s={s}: v2/v1 {ratio:.3f}x (target {TARGET_SPEEDUP_V1}x) {ok}")
    ms = results.get(8192)
    if ms is not None:
        ratio = min(ms["sdpa cudnn"], ms["sdpa flash"]) / ms[best_name]
        ok = "met" if ratio >= TARGET_VS_BF16_8K else "MISSED"
        out.append(f"s=8192: v2 vs best BF16 {ratio:.3f}x (target {TARGET_VS_BF16_8K}x) {ok}")
    return "targets: " + "; ".join(out)


# ---------------------------------------------------------------------------- main


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accuracy", action="store_true")
    parser.add_argument("--speed", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    v1_attention = load_baseline(args.baseline) if args.baseline else None
    report = {"environment": environment(), "command": " ".join(sys.argv)}
    texts = [f"# Rules v2 against v1\n\n{report['environment']}\n\ncommand: `{report['command']}`"]
    if args.accuracy:
        report["accuracy"] = accuracy(v1_attention)
        families = "\n".join(f"- {k}: {v}" for k, v in FAMILIES.items())
        texts.append("## Accuracy\n\n" + families + "\n\n" + _accuracy_markdown(report["accuracy"]))
    if args.speed:
        results = speed(v1_attention, args.rounds)
        best = best_config(results)
        report["speed"], report["best_config"] = results, best
        texts.append("## Speed\n\n" + _speed_markdown(results, best))
    text = "\n\n".join(texts) + "\n"
    (args.out / "v_scale_rules.md").write_text(text)
    (args.out / "v_scale_rules.json").write_text(json.dumps(report, indent=1, default=str))
    print(text)


if __name__ == "__main__":
    main()
