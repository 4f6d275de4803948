"""Speed of several builds of the extension side by side: an A/B of kernel variants in one run.

    python benchmarks/attention/ab_sm90_builds.py --out DIR --lib base=DIR_A --lib new=DIR_B \
        [--rounds 3] [--entries "cuda kernel,cuda"] [--head-dim 128|64]

A Python process loads one `transformer_engine_exact_fp8`, so each build runs in its own process:
round r runs bench_sm90_forward.py (one round of its shapes and entries) once per build, the builds
in rotated order, so that drifts of the device clock spread over every build. The table holds the
median over rounds of each build's TFLOPS per shape and entry, and its ratio to the first build.
Writes DIR/ab_sm90.md and DIR/ab_sm90.json and prints the table.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "attention" / "bench_sm90_forward.py"


def _lib(text: str):
    name, sep, path = text.partition("=")
    if not sep or not name or not Path(path).is_dir():
        raise argparse.ArgumentTypeError(f"expected NAME=DIR with an existing DIR, got {text!r}")
    return name, Path(path).resolve()


def run_round(name: str, lib: Path, entries: str, out: Path, r: int, head_dim: int) -> list:
    """Round r of bench_sm90_forward.py with `lib` first on the path: its result rows."""
    folder = out / "rounds" / f"round{r}" / name
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(lib), str(ROOT)]))
    cmd = [sys.executable, str(BENCH), "--out", str(folder), "--rounds", "1", "--entries", entries,
           "--head-dim", str(head_dim)]  # fmt: skip
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads((folder / "sm90_forward.json").read_text())["results"]


def ab_table(libs, rounds: int, entries: str, out: Path, head_dim: int = 128) -> dict:
    """{(shape, entry): {build: [tflops of each round]}}"""
    (out / "rounds").mkdir(parents=True, exist_ok=True)
    table = {}
    for r in range(rounds):
        order = libs[r % len(libs) :] + libs[: r % len(libs)]
        for name, lib in order:
            for row in run_round(name, lib, entries, out, r, head_dim):
                key = (tuple(row["shape"]), row["entry"])
                table.setdefault(key, {}).setdefault(name, []).append(row["tflops"])
    return table


def markdown(table: dict, names, rounds: int, head_dim: int = 128) -> str:
    lines = [
        f"TFLOPS per build (median of {rounds} rounds, builds rotated per round), causal bshd"
        f" bf16 d={head_dim}; ratio to {names[0]}",
        "",
        "| b, h, h_kv, s | entry | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for (shape, entry), by_build in table.items():
        base = statistics.median(by_build[names[0]]) if names[0] in by_build else None
        cells = []
        for name in names:
            if name not in by_build:
                cells.append("-")
                continue
            t = statistics.median(by_build[name])
            cells.append(f"{t:.0f}" + (f" ({t / base:.3f}x)" if base and name != names[0] else ""))
        b, h, h_kv, s = shape
        lines.append(f"| {b}, {h}, {h_kv}, {s // 1024}k | {entry} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the table and rounds")
    parser.add_argument(
        "--lib", type=_lib, action="append", required=True,
        help="NAME=DIR: a folder holding one build of transformer_engine_exact_fp8 (repeat)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--entries", default="cuda kernel,cuda")
    parser.add_argument("--head-dim", type=int, choices=(64, 128), default=128)
    args = parser.parse_args(argv)
    names = [name for name, _ in args.lib]
    if len(set(names)) != len(names) or args.rounds < 1:
        parser.error("build names must differ and --rounds be >= 1")
    table = ab_table(args.lib, args.rounds, args.entries, args.out, args.head_dim)
    text = markdown(table, names, args.rounds, args.head_dim)
    (args.out / "ab_sm90.md").write_text(text)
    rows = [dict(shape=list(k[0]), entry=k[1], tflops=v) for k, v in table.items()]
    (args.out / "ab_sm90.json").write_text(
        json.dumps(dict(builds=names, head_dim=args.head_dim, results=rows), indent=1)
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
