"""Summary of an Nsight Compute source page: where the warps stall and which instructions run.

    python benchmarks/attention/ncu_summary.py SOURCE_CSV [--per N] [--top 12]

SOURCE_CSV: `ncu -i REPORT --page source --csv --print-source sass` (tools/gpu_sm90_profile.sh
writes it). Prints the warp-state samples by stall reason (share of all samples), the
instructions with the most samples (their two largest reasons), and the executed instructions
by opcode, divided by --per (e.g. the consumer warps times the KV tiles visited, to read them as
instructions per warp and tile).
"""

import argparse
import collections
import csv
import sys
from pathlib import Path


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def _opcode(source: str) -> str:
    words = source.split()
    if not words:
        return "?"
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def read_source_page(path: Path):
    """(header, rows) of the CSV's table (the first line names the kernel)."""
    rows = list(csv.reader(path.open()))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    return rows[start], rows[start + 1 :]


def summarize(path: Path, per: float = 1.0, top: int = 12) -> str:
    header, rows = read_source_page(path)
    col = {name: i for i, name in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    totals = {s: sum(_number(r[col[s]]) for r in rows) for s in stalls}
    samples = sum(totals.values()) or 1.0
    lines = [f"warp-state samples: {samples:.0f}", "| reason | share |", "|---|---|"]
    for name, value in sorted(totals.items(), key=lambda x: -x[1])[:top]:
        lines.append(f"| {name[len('stall_'):]} | {100 * value / samples:.1f} % |")
    sampled = col["Warp Stall Sampling (All Samples)"]
    lines += ["", "| samples | instruction | top reasons |", "|---|---|---|"]
    for r in sorted(rows, key=lambda r: -_number(r[sampled]))[:top]:
        reasons = sorted(((_number(r[col[s]]), s[len("stall_") :]) for s in stalls), reverse=True)
        text = ", ".join(f"{name} {value:.0f}" for value, name in reasons[:2])
        lines.append(f"| {_number(r[sampled]):.0f} | `{r[1].strip()[:60]}` | {text} |")
    executed = col["Instructions Executed"]
    mix = collections.Counter()
    for r in rows:
        mix[_opcode(r[1].strip())] += _number(r[executed])
    lines += ["", f"| opcode | executed / {per:g} |", "|---|---|"]
    lines.append(f"| (all) | {sum(mix.values()) / per:.1f} |")
    for name, value in mix.most_common(top):
        lines.append(f"| {name} | {value / per:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source_csv", type=Path)
    parser.add_argument("--per", type=float, default=1.0, help="divide instruction counts by N")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    print(summarize(args.source_csv, args.per, args.top), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
