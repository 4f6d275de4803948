"""te-fp8-causality-audit: does any FP8 attention path let a masked token change an output?

For every (path, scenario) it runs the attention twice, on a base input and on a copy whose masked
tokens were changed, and compares the protected outputs bit for bit. Paths:

  bf16              unquantized attention (control; must be exact)
  upstream-current  upstream TE 2.20.2 current scaling rule (one amax over concat(Q, K, V))
  upstream-mxfp8    upstream TE 2.20.2 MXFP8 rule (FP8 V blocks straddle the mask boundary)
  upstream-delayed  upstream TE 2.20.2 DelayedScaling (through TE on a GPU only)
  fork-current      this fork's mask-exact current scaling (must be exact)
  fork-mxfp8        this fork's mask-exact MXFP8 (must be exact)

--device cpu runs every path but upstream-delayed through the pure-PyTorch reference numerics
(reference/attention.py). --device cuda runs every path through TE's DotProductAttention on the
GPU (audit/te_runner.py); a path that cannot run there gets a row that says why and counts as neither
exact nor leaky. --device auto picks cuda when there is a GPU and TE imports; with a GPU but no
importable TE it runs the fork paths through the fork's Triton kernels directly and the other
paths through the reference numerics, and says so in the header; without a GPU, cpu.
Exit status 1 if any fork-* or bf16 row is not exact (or could not run).

--plot FILE.png draws, for each path, the prefix change against the distance of the perturbed
token from the prefix end (audit/plot.py); --plot-data FILE.json writes the same data as JSON.
"""

import argparse
import json
import os
import platform
from dataclasses import asdict, dataclass
from typing import Callable, List, Optional, Tuple

import torch

from . import plot, te_runner
from .te_runner import TE_PATHS, NotRunnable
from ..masks import to_tokens
from ..reference.attention import PATHS, reference_attention
from .scenarios import REPORT_SCENARIOS, Scenario, build_scenario, scenario_names
from ..testing import prefix_change

__all__ = ["AuditRow", "run_audit", "row_json", "output_path_error", "main"]

MUST_BE_EXACT = ("bf16", "fork-current", "fork-mxfp8")
REFERENCE_BACKEND = "reference (CPU)"
KERNEL_BACKEND = "triton-kernel (GPU)"
NOT_RUNNABLE = "not runnable here"  # the backend column of a row that did not run; note: why
# Modes: "cpu" (reference numerics), "te" (TE's modules on the GPU), "kernels" (the fork's kernels
# directly on the GPU, the other paths through the reference numerics).
MODES = ("cpu", "te", "kernels")


@dataclass
class AuditRow:
    path: str
    scenario: str
    max_abs: Optional[float]  # None: not run here
    changed: Optional[int]
    exact: Optional[bool]  # None: not run here (neither exact nor leaky)
    backend: str
    trials: int
    note: str = ""  # why a path did not run; written to JSON only when set


def row_json(row: AuditRow) -> dict:
    """The JSON object of a row (the `note` key only when there is a note)."""
    out = asdict(row)
    if not out["note"]:
        del out["note"]
    return out


def _reference_runner(path: str) -> Callable:
    def run(q, k, v, kw):
        return reference_attention(path, q, k, v, **kw).out, REFERENCE_BACKEND

    return run


def _kernel_runner(path: str) -> Callable:
    """The fork's GPU kernel for fork-* paths (imported lazily: it needs Triton and a GPU)."""
    from ..kernels import attention_forward

    recipe = {"fork-current": "current", "fork-mxfp8": "mxfp8"}[path]

    def run(q, k, v, kw):
        kw = dict(kw)
        for side in ("q", "kv"):
            lens = kw.pop(f"seqlens_{side}", None)
            if lens is not None:
                cu = torch.tensor([0] + list(lens)).cumsum(0).to(torch.int32)
                kw[f"cu_seqlens_{side}"] = cu
        kw = {key: val.cuda() if torch.is_tensor(val) else val for key, val in kw.items()}
        out, _ = attention_forward(q.cuda(), k.cuda(), v.cuda(), recipe=recipe, **kw)
        return out.cpu(), KERNEL_BACKEND

    return run


def _runner(path: str, mode: str) -> Callable:
    """run(q, k, v, kw) -> (out, backend) for `path` in `mode`; raises NotRunnable."""
    if mode == "te":
        return te_runner.te_runner(path)
    if path not in PATHS:
        raise NotRunnable(f"{path} has no reference numerics; it runs through TE only")
    if mode == "kernels" and path.startswith("fork-"):
        return _kernel_runner(path)
    return _reference_runner(path)


def _check(run: Callable, sc: Scenario) -> Tuple[float, int, str]:
    fmt = sc.kwargs.get("qkv_format", "bshd")
    base, backend = run(sc.q, sc.k, sc.v, sc.kwargs)
    pert, _ = run(sc.q2, sc.k2, sc.v2, sc.kwargs)
    max_abs, changed = prefix_change(to_tokens(base, fmt), to_tokens(pert, fmt), sc.protected)
    return max_abs, changed, backend


def _not_run(path: str, scenario: str, reason: str) -> AuditRow:
    return AuditRow(path, scenario, None, None, None, NOT_RUNNABLE, 0, reason)


def _audit_row(run: Callable, path: str, name: str, trials: int, seed: int) -> AuditRow:
    """max_abs and changed are the max and the sum over trials (report scenarios run once)."""
    gen = torch.Generator().manual_seed(seed)
    n = 1 if name in REPORT_SCENARIOS else trials
    worst, total, backends = 0.0, 0, []
    try:
        for _ in range(n):
            max_abs, changed, backend = _check(run, build_scenario(name, gen))
            worst, total = max(worst, max_abs), total + changed
            backends += [backend] if backend not in backends else []
    except NotRunnable as err:
        return _not_run(path, name, str(err))
    return AuditRow(path, name, worst, total, total == 0, " | ".join(backends), n)


def run_audit(
    paths=PATHS, scenarios=None, trials: int = 3, seed: int = 0, mode: str = "cpu"
) -> List[AuditRow]:
    """One AuditRow per (path, scenario), in `mode` (see MODES)."""
    if trials < 1:  # no draw would leave a randomized row exact that checked nothing
        raise ValueError(f"trials must be >= 1, got {trials}")
    rows = []
    for path in paths:
        try:
            run = _runner(path, mode)
        except NotRunnable as err:
            rows += [_not_run(path, name, str(err)) for name in scenarios or scenario_names()]
            continue
        for name in scenarios or scenario_names():
            rows.append(_audit_row(run, path, name, trials, seed))
    return rows


def _resolve_mode(device: str) -> Tuple[str, str]:
    """(mode, a header note saying why when auto fell back)."""
    if device == "cpu":
        return "cpu", ""
    if not torch.cuda.is_available():
        if device == "cuda":
            raise SystemExit("--device cuda: no CUDA GPU is visible")
        return "cpu", ""
    te_error = te_runner.te_import_error()
    if te_error is None:
        return "te", ""
    if device == "cuda":
        raise SystemExit(f"--device cuda runs through TE, but {te_error}")
    try:
        from ..triton import attention  # noqa: F401  (the kernels need Triton)
    except ImportError as err:
        return (
            "cpu",
            f"a GPU is visible but {te_error}, and the fork's kernels do not import ({err})",
        )
    return "kernels", (
        f"{te_error}: the fork paths run the fork's kernels directly, the other paths the"
        " reference numerics"
    )


def _header(mode: str, note: str = "") -> str:
    device = "cpu" if mode == "cpu" else "cuda"
    lines = [
        f"te-fp8-causality-audit  device={device}  torch={torch.__version__}"
        f"  python={platform.python_version()}"
    ]
    if mode == "te":
        lines += te_runner.te_environment()
    elif mode == "kernels":
        import triton

        lines.append(f"gpu={torch.cuda.get_device_name()}  triton={triton.__version__}")
    if note:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(rows: List[AuditRow]) -> str:
    head = f"{'path':<17} {'scenario':<30} {'max_abs':>16} {'changed':>8} {'exact':>6}  backend"
    lines = [head, "-" * len(head)]
    for r in rows:
        exact = "n/a" if r.exact is None else ("yes" if r.exact else "NO")
        detail = f"{r.backend}; {r.note}" if r.note else r.backend
        lines.append(
            f"{r.path:<17} {r.scenario:<30} {_fmt(r.max_abs, '>16.10e'):>16}"
            f" {_fmt(r.changed, '>8d'):>8} {exact:>6}  {detail}"
        )
    return "\n".join(lines)


def _summary(rows: List[AuditRow]) -> Tuple[str, bool]:
    """(the closing line, whether a path that must be exact failed: leaked or did not run)."""
    leaks = [r for r in rows if r.exact is False]
    not_run = [r for r in rows if r.exact is None]
    bad_leaks = [r for r in leaks if r.path in MUST_BE_EXACT]
    bad_not_run = [r for r in not_run if r.path in MUST_BE_EXACT]
    line = (
        f"\n{len(rows)} rows, {len(leaks)} not exact; {len(bad_leaks)} of them on a path that"
        " must be exact"
    )
    if not_run:
        line += (
            f"; {len(not_run)} not run here (neither exact nor leaky), {len(bad_not_run)} of them"
            " on a path that must be exact"
        )
    return line, bool(bad_leaks or bad_not_run)


class _Parser(argparse.ArgumentParser):
    """argparse, with an argument error reported as one line (exit status 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


MAX_PLOT_DISTANCE = 4096
"""The largest --max-distance: the CPU reference then attends over 4480 tokens in fp64."""

_EPILOG = """exit status: 0 when every bf16 and fork-* row is exact; 1 when one of them changed a
protected output or could not run; 2 for an argument error (nothing ran)."""


def _trials(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"must be >= 1, got {value} (a randomized scenario drawn no time would check nothing"
            " and could not fail)"
        )
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _max_distance(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= MAX_PLOT_DISTANCE or value & (value - 1):
        raise argparse.ArgumentTypeError(
            f"must be a power of two from 1 to {MAX_PLOT_DISTANCE} (the plot's distances are 1, 2,"
            f" 4, ..., max), got {value}"
        )
    return value


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="te-fp8-causality-audit",
        description=__doc__.split("\n")[0],
        epilog=_EPILOG,
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="cpu: the reference numerics; cuda: every path through TE's DotProductAttention"
        " (needs a GPU and the fork installed); auto (default): cuda when it can run, else the"
        " fork's kernels on the GPU, else cpu",
    )
    parser.add_argument(
        "--paths",
        nargs="+",
        choices=TE_PATHS,
        default=None,
        metavar="PATH",
        help="the attention paths to audit (default: every path the device runs): "
        + ", ".join(TE_PATHS),
    )
    parser.add_argument(
        "--scenarios",
        nargs="+",
        choices=scenario_names(),
        default=None,
        metavar="SCENARIO",
        help="the scenarios to run (default: all): " + ", ".join(scenario_names()),
    )
    parser.add_argument(
        "--trials",
        type=_trials,
        default=3,
        help="random draws per randomized scenario, >= 1 (default 3; the report-* scenarios run"
        " once)",
    )
    parser.add_argument(
        "--seed", type=_seed, default=0, help="seed of the random inputs, >= 0 (default 0)"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the rows to FILE as a JSON list")
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw the prefix change against the perturbed token's distance into FILE.png"
        " (needs matplotlib)",
    )
    parser.add_argument(
        "--plot-data",
        metavar="FILE.json",
        help="write the data of that plot to FILE.json (no matplotlib needed; draw it later with"
        " python -m %s.plot FILE.json FILE.png)" % __package__,
    )
    parser.add_argument(
        "--max-distance",
        type=_max_distance,
        default=512,
        help="largest distance of the plot, a power of two from 1 to %d (default 512)"
        % MAX_PLOT_DISTANCE,
    )
    return parser


def output_path_error(path: str) -> Optional[str]:
    """Why `path` cannot be written as an output file, or None when it can."""
    target = os.path.abspath(path)
    if os.path.isdir(target):
        return f"{path} is a directory"
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        return f"the folder {folder} does not exist"
    if os.path.exists(target) and not os.access(target, os.W_OK):
        return f"{path} is not writable"
    if not os.path.exists(target) and not os.access(folder, os.W_OK | os.X_OK):
        return f"the folder {folder} is not writable"
    return None


def _parse(argv: Optional[List[str]]) -> argparse.Namespace:
    """The arguments, checked before anything runs: argument errors exit 2 with one line."""
    parser = _parser()
    args = parser.parse_args(argv)
    outputs = [(f"--{name}", getattr(args, name.replace("-", "_"))) for name in OUTPUT_OPTIONS]
    outputs = [(option, path) for option, path in outputs if path]
    for option, path in outputs:
        error = output_path_error(path)
        if error:
            parser.error(f"{option} {path}: {error}")
    real = [os.path.realpath(path) for _, path in outputs]
    if len(set(real)) < len(real):
        parser.error("the output files must differ: " + ", ".join(f"{o} {p}" for o, p in outputs))
    if args.plot:
        missing = plot.matplotlib_missing()
        if missing:
            parser.error(f"--plot needs matplotlib ({missing}): {plot.MATPLOTLIB_HINT}")
    return args


OUTPUT_OPTIONS = ("json", "plot", "plot-data")


def _default_paths(mode: str) -> List[str]:
    return list(TE_PATHS if mode == "te" else PATHS)


def main(argv: Optional[List[str]] = None) -> int:
    args = _parse(argv)  # before the audit runs: a bad argument or output path exits 2 here
    mode, note = _resolve_mode(args.device)
    paths = args.paths or _default_paths(mode)
    header = _header(mode, note)
    rows = run_audit(paths, args.scenarios, args.trials, args.seed, mode)
    print(header)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([row_json(r) for r in rows], f, indent=1)
    if args.plot or args.plot_data:
        sweep = plot.distance_sweep(
            lambda path: _runner(path, mode), paths, args.max_distance, args.seed, header
        )
        print("\n" + plot.format_sweep(sweep))
        plot.save(sweep, png=args.plot, data=args.plot_data)
    line, failed = _summary(rows)
    print(line)
    return 1 if failed else 0
