"""TFLOPS against sequence length per path, from bench_te_attention.py's JSON.

python benchmarks/te/plot_speed.py bench_te.json bench_te.png
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional

MODES = ("fwd", "fwd+bwd", "bwd")  # the passes drawn, those present in the rows


def _series(rows: List[Dict], mode: str) -> Dict[str, List]:
    """path -> [(s, tflops)] for the rows of `mode` that were measured."""
    out: Dict[str, List] = {}
    for r in rows:
        if r["mode"] == mode and r["tflops"]:
            out.setdefault(r["path"], []).append((r["s"], r["tflops"]))
    return {path: sorted(points) for path, points in out.items()}


def plot_speed(result: Dict, png: Path) -> None:
    """One panel per pass (fwd, fwd+bwd, bwd: those the rows hold); raises ImportError without
    matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env = result["environment"]
    modes = [m for m in MODES if any(r["mode"] == m for r in result["rows"])]
    fig, axes = plt.subplots(1, len(modes), figsize=(5.5 * len(modes), 4.5), sharey=False)
    for ax, mode in zip(axes if len(modes) > 1 else [axes], modes):
        for path, points in _series(result["rows"], mode).items():
            s, tflops = zip(*points)
            ax.plot(s, tflops, marker="o", label=path)
        seqlens = sorted({r["s"] for r in result["rows"]})
        ax.set_xscale("log", base=2)
        ax.set_xticks(seqlens, [f"{s // 1024}k" for s in seqlens])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOPS (causal)")
        ax.set_title(mode)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"DotProductAttention through TE's API, bshd causal, {env['gpu']}, {env['date']}\n"
        f"TE {env['transformer_engine']}, cuDNN {env['cudnn']}, torch {env['torch']},"
        f" Triton {env['triton']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("json", type=Path)
    parser.add_argument("png", type=Path)
    args = parser.parse_args(argv)
    plot_speed(json.loads(args.json.read_text()), args.png)
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
