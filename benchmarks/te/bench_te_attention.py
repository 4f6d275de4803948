"""Speed of FP8 attention through TE's API: the fork vs upstream BF16 vs upstream DelayedScaling.

One run, one process, TE's DotProductAttention (bshd, causal, h=16, d=128, b=2; s = 4k, 8k, 16k):

  upstream-bf16     autocast disabled (upstream's code: the fork does not touch BF16 attention)
  upstream-delayed  DelayedScaling(fp8_dpa=True) (upstream's code: the recipe has no mask-exact field)
  fork-current      Float8CurrentScaling(fp8_dpa=True, fp8_dpa_mask_exact=True)
  fork-mxfp8        MXFP8BlockScaling(fp8_dpa=True, fp8_dpa_mask_exact=True) (an extra row; on sm90
                    its MX scales are applied in software)

Each recipe keeps its default format (HYBRID for DelayedScaling and Float8CurrentScaling: E4M3
forward, E5M2 gradients; E4M3 for MXFP8BlockScaling). Nondeterministic algorithms are left at
TE's default (allowed) unless NVTE_ALLOW_NONDETERMINISTIC_ALGO says otherwise.
Passes: `fwd` = eval module under torch.no_grad(); `fwd+bwd` = train module, forward under autocast
then backward of a random output gradient (q, k, v grads reset to None each step); `bwd` = that
backward alone: each call's forward runs untimed before it (upstream's backward runs once per
forward, so a graph kept for several backward calls does not serve).
FLOPs (causal, counted once for the visible half): fwd = 2*b*h*s*s*d; fwd+bwd = 3.5x fwd;
bwd = 2.5x fwd.
Timing: triton.testing.do_bench medians (L2 flushed before every call), for `bwd`
testing.gpu_ms_after's (CUDA events around the backward, queued behind a sleep kernel after its
forward and an L2 flush; medians of 10 calls), taken round-robin over the paths `--rounds` times;
the table shows the median over rounds. Times include TE's Python overhead and, for the fork, its
quantization pass: this is what a user of the API gets.
Also the host time per forward call of each path at a tiny shape (HOST_SHAPE), where the GPU work
is too small to hide it.

    python benchmarks/te/bench_te_attention.py --out DIR

writes DIR/bench_te.md (table + targets), DIR/bench_te.json, and DIR/bench_te.png if matplotlib
is installed (else draw it later: python benchmarks/te/plot_speed.py DIR/bench_te.json OUT.png).
"""

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

PATHS = ("upstream-bf16", "upstream-delayed", "fork-current", "fork-mxfp8")
# The targets through TE: (issue, pass, path, baseline, minimum ratio, smallest s it applies
# to). Issue 20: the forward >= 1.3x upstream BF16 and at least as fast as upstream
# DelayedScaling's cuDNN FP8; issue 21: forward + backward no slower than 0.92x upstream BF16.
TARGETS = (
    (20, "fwd", "fork-current", "upstream-bf16", 1.3, 8192),
    (20, "fwd", "fork-current", "upstream-delayed", 1.0, 8192),
    (21, "fwd+bwd", "fork-current", "upstream-bf16", 0.92, 8192),
)
MODES = ("fwd", "fwd+bwd", "bwd")
FLOPS_FACTOR = {"fwd": 1.0, "fwd+bwd": 3.5, "bwd": 2.5}  # of the forward's FLOPs
HOST_SHAPE = (1, 128, 16, 128)  # (b, s, h, d): small enough that the host sets the pace


def causal_flops(b: int, h: int, s: int, d: int, mode: str) -> float:
    """FLOPs of causal attention: 2*b*h*s*s*d forward (half of 4*b*h*s*s*d), 3.5x with backward,
    2.5x the backward alone."""
    return 2.0 * b * h * s * s * d * FLOPS_FACTOR[mode]


def recipe_context(path: str):
    """A context manager yielding the autocast recipe of `path` (None: BF16). Fork paths go through
    te_recipe.attention_fp8_autocast_recipe (MXFP8 attention below sm100 needs TE's
    NVTE_DPA_FP8_RECIPE switch under a current-scaling autocast); enter it around every call."""
    from transformer_engine.common import recipe
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.te.recipe import (
        MASK_EXACT_FIELD,
        attention_fp8_autocast_recipe,
    )

    if path == "upstream-bf16":
        return contextlib.nullcontext(None)
    if path == "upstream-delayed":
        return contextlib.nullcontext(recipe.DelayedScaling(fp8_dpa=True))
    if MASK_EXACT_FIELD not in getattr(recipe.Float8CurrentScaling, "__dataclass_fields__", {}):
        raise RuntimeError(
            "this transformer_engine is upstream, not the fork (no mask-exact field)"
        )
    kind = "current" if path == "fork-current" else "mxfp8"
    return attention_fp8_autocast_recipe(kind, **{MASK_EXACT_FIELD: True})


def _inputs(b: int, s: int, h: int, d: int, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [
        torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        for _ in range(4)  # q, k, v, and the output gradient (as [b, s, h, d])
    ]


def _causal_dpa(te, q, train: bool):
    """TE's DotProductAttention for q's heads and head dim: bshd, causal, on the GPU."""
    dpa = te.DotProductAttention(q.shape[2], q.shape[3], qkv_format="bshd", attn_mask_type="causal")
    return dpa.cuda().train(train)


def _forward(te, path: str, q, k, v) -> Callable:
    dpa = _causal_dpa(te, q, train=False)

    def fn():
        with recipe_context(path) as recipe, torch.no_grad():
            with te.autocast(enabled=recipe is not None, recipe=recipe):
                return dpa(q, k, v)

    return fn


def _training_step(te, path: str, q, k, v, dout) -> Callable:
    """A training step's attention: fn() runs a forward under autocast and its backward (the
    `fwd+bwd` pass); fn.forward and fn.backward run them apart (the `bwd` pass times the
    backward alone, testing.gpu_ms_after). q, k, v grads are reset to None by each forward."""
    dpa = _causal_dpa(te, q, train=True)
    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
    grad = dout.flatten(2)  # TE returns [b, s, h * d]

    def forward():
        for x in (qg, kg, vg):
            x.grad = None
        with recipe_context(path) as recipe:
            with te.autocast(enabled=recipe is not None, recipe=recipe):
                return dpa(qg, kg, vg)

    def backward(out):
        with recipe_context(path):
            out.backward(grad)

    def fn():
        backward(forward())

    fn.forward, fn.backward = forward, backward
    return fn


def _accuracy_note(te, path: str, q, k, v, bf16_out: torch.Tensor) -> str:
    """Whether FP8 reached the output (bitwise != BF16) and the relative error against BF16."""
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
        rel_frobenius_error,
    )

    out = _forward(te, path, q, k, v)()
    rel = rel_frobenius_error(out, bf16_out)
    used = "FP8 in use" if not torch.equal(out, bf16_out) else "output == BF16 bitwise"
    return f"{used}; rel. error vs BF16 {rel:.1e}"


def _build(te, path: str, mode: str, tensors) -> Callable:
    if mode == "fwd":
        return _forward(te, path, *tensors[:3])
    return _training_step(te, path, *tensors)


def bench_shape(te, b: int, s: int, h: int, d: int, rounds: int, rep_ms: int) -> List[Dict]:
    """Rows for one shape: every (mode, path), timed round-robin."""
    import triton.testing
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
        gpu_ms_after,
    )

    tensors = _inputs(b, s, h, d)
    bf16_out = _forward(te, "upstream-bf16", *tensors[:3])()
    rows, fns = [], {}
    for mode in MODES:
        for path in PATHS:
            row = dict(s=s, b=b, h=h, d=d, mode=mode, path=path, ms=None, tflops=None, note="")
            try:
                fns[(mode, path)] = _build(te, path, mode, tensors)
                fns[(mode, path)]()  # compile / build graphs outside the timing
                if mode == "fwd" and path != "upstream-bf16":
                    row["note"] = _accuracy_note(te, path, *tensors[:3], bf16_out)
            except Exception as err:  # a path that cannot run here gets a row that says why
                fns.pop((mode, path), None)
                row["note"] = f"not runnable: {type(err).__name__}: {str(err).splitlines()[0]}"
            rows.append(row)
    times = {key: [] for key in fns}
    for _ in range(rounds):
        for key, fn in fns.items():
            if key[0] == "bwd":
                times[key].append(gpu_ms_after(fn.forward, fn.backward))
                continue
            ms = triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median")
            times[key].append(ms)
    for row in rows:
        key = (row["mode"], row["path"])
        if key in times:
            row["ms"] = statistics.median(times[key])
            row["tflops"] = causal_flops(b, h, s, d, row["mode"]) / row["ms"] / 1e9
    return rows


def host_us_per_path(te, calls: int = 200) -> Dict[str, float]:
    """Host (CPU) microseconds per forward call of each path at HOST_SHAPE (testing's
    host_us_per_call: calls back to back, median of 3 repeats)."""
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
        host_us_per_call,
    )

    q, k, v, _ = _inputs(*HOST_SHAPE)
    result = {}
    for path in PATHS:
        fn = _forward(te, path, q, k, v)
        try:
            result[path] = host_us_per_call(fn, calls)
        except Exception:  # a path that cannot run here (its row in the table says why)
            continue
    return result


def host_markdown(host: Dict[str, float]) -> str:
    b, s, h, d = HOST_SHAPE
    return (
        f"Host time per forward call at b={b}, s={s}, h={h}, d={d} (calls back to back, median"
        " of 3): " + ", ".join(f"{path} {us:.0f} us" for path, us in host.items())
    )


def add_ratios(rows: List[Dict]) -> None:
    """x_bf16 / x_delayed: TFLOPS over the same (s, mode)'s upstream-bf16 / -delayed row."""
    by_key = {(r["s"], r["mode"], r["path"]): r for r in rows}
    for r in rows:
        for base, col in (("upstream-bf16", "x_bf16"), ("upstream-delayed", "x_delayed")):
            ref = by_key.get((r["s"], r["mode"], base))
            ok = r["tflops"] and ref and ref["tflops"]
            r[col] = r["tflops"] / ref["tflops"] if ok else None


def check_targets(rows: List[Dict]) -> List[str]:
    """One line per (target, s): the measured ratio and whether it meets its issue's target."""
    by_key = {(r["s"], r["mode"], r["path"]): r for r in rows}
    lines = []
    for issue, mode, path, base, target, min_s in TARGETS:
        for s in sorted({r["s"] for r in rows if r["s"] >= min_s}):
            a, ref = by_key.get((s, mode, path)), by_key.get((s, mode, base))
            if not (a and ref and a["tflops"] and ref["tflops"]):
                lines.append(
                    f"issue {issue}: {mode} {path} / {base} at s={s}: not measured"
                    f" (target {target}x)"
                )
                continue
            ratio = a["tflops"] / ref["tflops"]
            verdict = "MET" if ratio >= target else "MISSED"
            lines.append(
                f"issue {issue}: {mode} {path} / {base} at s={s}: {ratio:.2f}x"
                f" (target {target}x) {verdict}"
            )
    return lines


def _cell(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown_table(rows: List[Dict]) -> str:
    lines = [
        "| s | b | pass | path | ms | TFLOPS | x BF16 | x Delayed | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['s']} | {r['b']} | {r['mode']} | {r['path']} | {_cell(r['ms'], '.3f')}"
            f" | {_cell(r['tflops'], '.0f')} | {_cell(r['x_bf16'], '.2f')}"
            f" | {_cell(r['x_delayed'], '.2f')} | {r['note']} |"
        )
    return "\n".join(lines)


def environment(te) -> Dict:
    import transformer_engine
    import triton

    major, minor = torch.cuda.get_device_capability()
    env_vars = ("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "NVTE_FP8_DPA_BWD", "NVTE_FP8_DPA_MASK_EXACT")
    return dict(
        date=datetime.date.today().isoformat(),
        gpu=f"{torch.cuda.get_device_name()} (sm{major}{minor})",
        torch=torch.__version__,
        cuda=torch.version.cuda,
        transformer_engine=transformer_engine.__version__,
        cudnn=".".join(str(x) for x in te.get_cudnn_version()),
        triton=triton.__version__,
        env={name: os.environ.get(name, "(unset)") for name in env_vars},
    )


def _write_png(result: Dict, png: Path) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import plot_speed

    try:
        plot_speed.plot_speed(result, png)
    except ImportError as err:
        return f"no PNG ({err}); draw it with: python benchmarks/te/plot_speed.py JSON PNG"
    return f"wrote {png}"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench_out")))
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rep-ms", type=int, default=100, help="do_bench time per measurement")
    args = parser.parse_args(argv)

    import transformer_engine.pytorch as te

    rows = []
    for s in args.seqlens:
        rows += bench_shape(te, args.batch, s, args.heads, args.head_dim, args.rounds, args.rep_ms)
    add_ratios(rows)
    host = host_us_per_path(te)
    result = dict(
        environment=environment(te), rows=rows, targets=check_targets(rows), host_us_per_call=host
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_te.json").write_text(json.dumps(result, indent=1))
    env = result["environment"]
    text = "\n".join(
        [
            f"# TE attention speed ({env['date']}, {env['gpu']})",
            f"torch {env['torch']} (CUDA {env['cuda']}), transformer_engine"
            f" {env['transformer_engine']}, cuDNN {env['cudnn']}, Triton {env['triton']};"
            f" env {env['env']}",
            "",
            markdown_table(rows),
            "",
            "Targets (issues 20 and 21):",
            *[f"- {line}" for line in result["targets"]],
            "",
            host_markdown(host),
        ]
    )
    (args.out / "bench_te.md").write_text(text + "\n")
    print(_write_png(result, args.out / "bench_te.png"))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
