"""The causality audit's picture: prefix change against the distance of the perturbed token.

One causal bshd input (random, with q = k so that each row attends mostly to its own token);
rows 0..t are the prefix. For each distance d = 1, 2, 4, ..., the Q, K and
V of token t + d are replaced by large values, and the plot shows, per path, the largest change of
any prefix output (max |difference| over rows <= t). Zero is drawn at a floor labelled "exact".
Upstream current scaling leaks at every distance (one amax over all tokens); upstream MXFP8 leaks
only while t + d stays in the 32-token V block of the prefix's last tokens; exact paths stay on the
floor.

    python -m transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.audit.plot \
        SWEEP.json OUT.png      # draw a sweep written with --plot-data (e.g. on a GPU machine
                                # without matplotlib) on a machine that has matplotlib
"""

import argparse
import json
import math
import sys
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .te_runner import NotRunnable
from ..formats import MX_BLOCK
from ..masks import to_tokens
from .scenarios import perturb_tokens, randn_with_outliers
from ..testing import prefix_change

__all__ = [
    "PREFIX_END",
    "sweep_distances",
    "distance_sweep",
    "format_sweep",
    "MATPLOTLIB_HINT",
    "matplotlib_missing",
    "require_matplotlib",
    "plot_sweep",
    "save",
    "main",
]

# The prefix ends 15 tokens into a 32-token MXFP8 V block (8 * 32 + 15): distances 1..16 stay in
# the block that holds the prefix's last 16 tokens, distances >= 32 do not.
PREFIX_END = 8 * MX_BLOCK + 15
HEADS, HEAD_DIM = 2, 64


def sweep_distances(max_distance: int) -> List[int]:
    """1, 2, 4, ..., max_distance (a power of two)."""
    if max_distance < 1 or max_distance & (max_distance - 1):
        raise ValueError(f"max_distance must be a power of two >= 1, got {max_distance}")
    return [2**i for i in range(int(math.log2(max_distance)) + 1)]


def _seq_len(max_distance: int) -> int:
    """Room for the farthest perturbed token, rounded up to a multiple of 128."""
    return -(-(PREFIX_END + max_distance + 1) // 128) * 128


def _perturbed(x: torch.Tensor, position: int, seed: int) -> torch.Tensor:
    """x [1, s, h, d] with token `position` replaced by garbage (the same draw at every position)."""
    where = (torch.arange(x.shape[1]) == position).view(1, -1)
    return perturb_tokens(x, where, torch.Generator().manual_seed(seed))


def _path_sweep(run: Callable, q, k, v, distances, seed) -> Dict:
    kw = dict(qkv_format="bshd", attn_mask_type="causal")
    protected = torch.arange(q.shape[1]) <= PREFIX_END  # [s] bool, b = 1
    base, backend = run(q, k, v, kw)
    max_abs, changed = [], []
    for d in distances:
        pos = PREFIX_END + d
        q2, k2, v2 = (_perturbed(x, pos, seed + 1) for x in (q, k, v))
        pert, _ = run(q2, k2, v2, kw)
        m, c = prefix_change(to_tokens(base, "bshd"), to_tokens(pert, "bshd"), protected)
        max_abs.append(m)
        changed.append(c)
    return dict(max_abs=max_abs, changed=changed, backend=backend, not_runnable="")


def distance_sweep(
    make_runner: Callable,
    paths: Sequence[str],
    max_distance: int = 512,
    seed: int = 0,
    header: str = "",
) -> Dict:
    """The sweep's data (JSON-ready). make_runner(path) -> run(q, k, v, kw) -> (out, backend);
    it, or a run, may raise NotRunnable (the path then carries the reason instead of data)."""
    distances = sweep_distances(max_distance)
    s = _seq_len(max_distance)
    gen = torch.Generator().manual_seed(seed)
    # q = k: each row attends mostly to its own token (score |q|^2 / sqrt(d) ~ 8 against ~1), so a
    # re-rounded prefix value moves its row's output by more than the output's BF16 rounding.
    q, v = (randn_with_outliers(gen, 1, s, HEADS, HEAD_DIM) for _ in range(2))
    k = q.clone()
    results = {}
    for path in paths:
        try:
            results[path] = _path_sweep(make_runner(path), q, k, v, distances, seed)
        except NotRunnable as err:
            results[path] = dict(max_abs=None, changed=None, backend="-", not_runnable=str(err))
    return dict(
        header=header,
        layout=f"bshd b=1 s={s} h={HEADS} d={HEAD_DIM} causal, bf16",
        prefix_end=PREFIX_END,
        perturbed="Q, K and V of token prefix_end + distance",
        distances=distances,
        paths=results,
    )


def format_sweep(sweep: Dict) -> str:
    """A text table: max_abs per path (rows) and distance (columns)."""
    distances = sweep["distances"]
    head = f"{'prefix change':<17}" + "".join(f" {'d=' + str(d):>9}" for d in distances)
    lines = [f"rows <= {sweep['prefix_end']} of {sweep['layout']}", head]
    for path, res in sweep["paths"].items():
        if res["not_runnable"]:
            lines.append(f"{path:<17} not run: {res['not_runnable']}")
            continue
        cells = "".join(f" {m:>9.2e}" if m else f" {'0':>9}" for m in res["max_abs"])
        lines.append(f"{path:<17}{cells}")
    return "\n".join(lines)


MATPLOTLIB_HINT = (
    "`pip install matplotlib` (tools/audit.sh --plot installs it), or write the data with"
    " --plot-data FILE.json and draw it where matplotlib is installed with"
    f" `python -m {__name__} FILE.json FILE.png`"
)


def matplotlib_missing() -> Optional[str]:
    """Why matplotlib cannot be imported, or None when it can."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        return str(err)
    return None


def require_matplotlib():
    """Import matplotlib (Agg backend) or exit with a clear message."""
    missing = matplotlib_missing()
    if missing:
        raise SystemExit(f"drawing the plot needs matplotlib ({missing}): {MATPLOTLIB_HINT}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _floor(sweep: Dict) -> float:
    """Where zero is drawn: a power of two 16x below the smallest non-zero change."""
    values = [m for r in sweep["paths"].values() for m in (r["max_abs"] or []) if m > 0]
    smallest = min(values) if values else 2.0**-20
    return 2.0 ** (math.floor(math.log2(smallest)) - 4)


MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _label(path: str, res: Dict) -> str:
    leaks = sum(1 for m in res["max_abs"] if m > 0)
    if leaks == 0:
        return f"{path}: exact at every distance"
    return f"{path}: leaks at {leaks}/{len(res['max_abs'])} distances"


def _y_ticks(ax, floor: float):
    """Powers of two above the floor (at most 8), and the floor itself labelled 0."""
    low = int(math.log2(floor)) + 2
    high = math.ceil(math.log2(max(ax.get_ylim()[1], 2.0**low)))
    step = max(1, math.ceil((high - low + 1) / 8))
    exps = list(range(high, low - 1, -step))
    return [floor] + [2.0**e for e in exps], ["0"] + [f"$2^{{{e}}}$" for e in exps]


def plot_sweep(sweep: Dict, png: str) -> None:
    """Log-log plot of the sweep into `png`."""
    plt = require_matplotlib()
    floor = _floor(sweep)
    distances = sweep["distances"]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    runnable = [(p, r) for p, r in sweep["paths"].items() if not r["not_runnable"]]
    for i, (path, res) in enumerate(runnable):
        y = [m if m > 0 else floor for m in res["max_abs"]]
        size = 11 - 1.3 * i  # exact paths overlap on the floor: shrinking markers keep all visible
        ax.plot(distances, y, marker=MARKERS[i % len(MARKERS)], ms=size, label=_label(path, res))
    ax.axhline(floor, color="gray", ls=":", lw=1)
    ax.text(distances[0], floor * 1.4, "0 = exact (no prefix output changed)", color="gray")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xticks(distances, [str(d) for d in distances])
    ax.set_yticks(*_y_ticks(ax, floor))
    ax.set_ylim(bottom=floor / 2)
    ax.set_xlabel(f"distance of the perturbed token from the prefix end (t = {PREFIX_END})")
    ax.set_ylabel("prefix change: max |diff| over rows <= t")
    ax.set_title(f"Causality audit: does a future token change the past?\n{sweep['layout']}")
    ax.legend(fontsize=8, loc="center right")
    skipped = [f"{p}: {r['not_runnable']}" for p, r in sweep["paths"].items() if r["not_runnable"]]
    footer = [sweep["header"].replace("\n", "  |  ")] + [f"not run: {s}" for s in skipped]
    fig.text(0.01, 0.005, "\n".join(x for x in footer if x), fontsize=6, va="bottom")
    fig.tight_layout(rect=(0, 0.04 + 0.02 * len(skipped), 1, 1))
    fig.savefig(png, dpi=120)
    plt.close(fig)


def save(sweep: Dict, png: Optional[str] = None, data: Optional[str] = None) -> None:
    """Write the sweep as JSON (data) and/or as a PNG."""
    if data:
        with open(data, "w", encoding="utf-8") as f:
            json.dump(sweep, f, indent=1)
    if png:
        plot_sweep(sweep, png)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Draw a sweep written by the audit's --plot-data.")
    parser.add_argument("data", help="JSON written by te-fp8-causality-audit --plot-data")
    parser.add_argument("png", help="the PNG to write")
    args = parser.parse_args(argv)
    with open(args.data, encoding="utf-8") as f:
        plot_sweep(json.load(f), args.png)
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
