"""te-fp8-causality-audit: does any FP8 attention path let a masked token change an output?

For every (path, scenario) it runs the attention twice, on a base input and on a copy whose masked
tokens were changed, and compares the protected outputs bit for bit. Paths:

  bf16              unquantized attention (control; must be exact)
  upstream-current  upstream TE 2.20.2 current scaling rule (one amax over concat(Q, K, V))
  upstream-mxfp8    upstream TE 2.20.2 MXFP8 rule (FP8 V blocks straddle the mask boundary)
  fork-current      this fork's mask-exact current scaling (must be exact)
  fork-mxfp8        this fork's mask-exact MXFP8 (must be exact)

--device cpu runs every path through the pure-PyTorch reference numerics (reference_attention.py).
--device cuda runs the fork paths through the fork's Triton kernels on the GPU and the other paths
through the reference numerics; the `backend` column says which ran. --device auto picks cuda when
a GPU and the kernels are available. Exit status 1 if any fork-* or bf16 row is not exact.
"""

import argparse
import json
import platform
import sys
from dataclasses import asdict, dataclass
from typing import Callable, List, Optional

import torch

from .reference_attention import PATHS, reference_attention, to_tokens
from .scenarios import REPORT_SCENARIOS, Scenario, build_scenario, scenario_names
from .testing import prefix_change

__all__ = ["AuditRow", "run_audit", "main"]

MUST_BE_EXACT = ("bf16", "fork-current", "fork-mxfp8")


@dataclass
class AuditRow:
    path: str
    scenario: str
    max_abs: float
    changed: int
    exact: bool
    backend: str
    trials: int


def _reference_runner(path: str) -> Callable:
    def run(q, k, v, kw):
        return reference_attention(path, q, k, v, **kw).out

    return run


def _kernel_runner(path: str) -> Callable:
    """The fork's GPU kernel for fork-* paths (imported lazily: it needs Triton and a GPU)."""
    from .attention import exact_fp8_attention_forward

    recipe = {"fork-current": "current", "fork-mxfp8": "mxfp8"}[path]

    def run(q, k, v, kw):
        kw = dict(kw)
        for side in ("q", "kv"):
            lens = kw.pop(f"seqlens_{side}", None)
            if lens is not None:
                cu = torch.tensor([0] + list(lens)).cumsum(0).to(torch.int32)
                kw[f"cu_seqlens_{side}"] = cu
        kw = {key: val.cuda() if torch.is_tensor(val) else val for key, val in kw.items()}
        out, _ = exact_fp8_attention_forward(q.cuda(), k.cuda(), v.cuda(), recipe=recipe, **kw)
        return out.cpu()

    return run


def _pick_runner(path: str, device: str):
    if device == "cuda" and path.startswith("fork-"):
        return _kernel_runner(path), "triton-kernel (GPU)"
    return _reference_runner(path), "reference (CPU)"


def _check(run: Callable, sc: Scenario):
    fmt = sc.kwargs.get("qkv_format", "bshd")
    base = to_tokens(run(sc.q, sc.k, sc.v, sc.kwargs), fmt)
    pert = to_tokens(run(sc.q2, sc.k2, sc.v2, sc.kwargs), fmt)
    return prefix_change(base, pert, sc.protected)


def run_audit(
    paths=PATHS, scenarios=None, trials: int = 3, seed: int = 0, device: str = "cpu"
) -> List[AuditRow]:
    """One AuditRow per (path, scenario): max_abs and changed are the max and the sum over trials
    (the report scenarios are deterministic and run once)."""
    rows = []
    for path in paths:
        run, backend = _pick_runner(path, device)
        for name in scenarios or scenario_names():
            gen = torch.Generator().manual_seed(seed)
            n = 1 if name in REPORT_SCENARIOS else trials
            worst, total = 0.0, 0
            for _ in range(n):
                max_abs, changed = _check(run, build_scenario(name, gen))
                worst, total = max(worst, max_abs), total + changed
            rows.append(AuditRow(path, name, worst, total, total == 0, backend, n))
    return rows


def _resolve_device(device: str) -> str:
    if device == "cpu":
        return "cpu"
    available = torch.cuda.is_available()
    try:
        from . import attention  # noqa: F401  (the kernels need Triton)
    except ImportError as err:
        available = False
        reason = f"the fork's kernels cannot be imported ({err})"
    else:
        reason = "no CUDA GPU is visible"
    if available:
        return "cuda"
    if device == "cuda":
        raise SystemExit(f"--device cuda: {reason}")
    return "cpu"


def _header(device: str) -> str:
    lines = [
        f"te-fp8-causality-audit  device={device}  torch={torch.__version__}"
        f"  python={platform.python_version()}"
    ]
    if device == "cuda":
        import triton

        lines.append(f"gpu={torch.cuda.get_device_name()}  triton={triton.__version__}")
    return "\n".join(lines)


def format_table(rows: List[AuditRow]) -> str:
    head = f"{'path':<17} {'scenario':<30} {'max_abs':>16} {'changed':>8} {'exact':>6}  backend"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.path:<17} {r.scenario:<30} {r.max_abs:>16.10e} {r.changed:>8d}"
            f" {'yes' if r.exact else 'NO':>6}  {r.backend}"
        )
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="te-fp8-causality-audit", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--scenarios", nargs="+", choices=scenario_names(), default=None)
    parser.add_argument("--trials", type=int, default=3, help="draws per randomized scenario")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="also write the rows as a JSON list")
    args = parser.parse_args(argv)

    device = _resolve_device(args.device)
    rows = run_audit(args.paths, args.scenarios, args.trials, args.seed, device)
    print(_header(device))
    print(format_table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    bad = [r for r in rows if r.path in MUST_BE_EXACT and not r.exact]
    leaks = sum(1 for r in rows if not r.exact)
    print(f"\n{len(rows)} rows, {leaks} not exact; {len(bad)} of them on a path that must be exact")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
