"""Speed of the sm_90a forward on inputs whose rows keep negative scores (the row maxima's fallback).

    python benchmarks/attention/bench_sm90_score_signs.py --out DIR [--rounds 3]

An FP8 visit takes its row maxima from the scores' bit patterns (softmax.h, Note [Row maxima from
the scores' bits]); a warp holding a row whose running max is still negative also takes the
smallest patterns, on every visit while that lasts. This measures what that costs on the inputs
that take it everywhere. Input families (b = 2, h = 16, s = 8k, d = 128, bshd bf16):
  "ordinary"       Q, K, V ~ N(0, 1): every row's running max turns positive at its first tile
  "negative rows"  every row's scores negative (testing.negative_score_inputs): every warp
                   takes the fallback at every visit
  "mixed rows"     the same for every 16th query row only, the others of either sign: one such
                   row puts its whole warp on the fallback
Entries: "cuda" (Q/K/V quantization included) and "cuda kernel" (operands quantized
beforehand), causal and no mask, timed as bench_sm90_forward.py's queued timing
(testing.gpu_ms_queued), round-robin --rounds times, medians. The table gives ms and the ratio
of each family's time to the ordinary inputs' (> 1: slower).

Writes DIR/sm90_score_signs.md and DIR/sm90_score_signs.json, and prints the table.
"""

import argparse
import importlib
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
try:  # an installed (or assembled) fork
    importlib.import_module("transformer_engine.pytorch.attention.dot_product_attention.exact_fp8")
except ImportError:  # the checkout
    sys.path.insert(0, str(ROOT))

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import (  # noqa: E402
    kernels,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (  # noqa: E402
    gpu_ms_queued,
    negative_score_inputs,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.cuda import (  # noqa: E402
    attention as cuda_attention,
)

SHAPE = (2, 8192, 16, 128)  # b, s, h, d
FAMILIES = ("ordinary", "negative rows", "mixed rows")
MASKS = {"causal": 1, "no_mask": 0}
ENTRIES = ("cuda", "cuda kernel")


def score_sign_inputs(family: str, shape=SHAPE, seed: int = 0, device: str = "cuda"):
    """Q, K, V [b, s, h, d] bf16 of one family (module docstring)."""
    if family == "ordinary":
        gen = torch.Generator(device=device).manual_seed(seed)
        q, k, v = (torch.randn(shape, generator=gen, device=device) for _ in range(3))
        return q.bfloat16(), k.bfloat16(), v.bfloat16()
    rows = slice(None) if family == "negative rows" else slice(None, None, 16)
    return negative_score_inputs(shape, rows, seed, device)


def _entries(q, k, v, mask: str):
    ops = cuda_attention.quantize_operands(q, k, v, qkv_format="bshd")
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[2], q.shape[0] * q.shape[1], dtype=torch.float32, device=q.device)
    scale = q.shape[-1] ** -0.5
    kw = dict(recipe="current", qkv_format="bshd", attn_mask_type=mask)
    return {
        "cuda": lambda: kernels.attention_forward(q, k, v, backend="cuda", **kw),
        "cuda kernel": lambda: cuda_attention.launch(ops, out, lse, MASKS[mask], scale),
    }


def speed_table(rounds: int):
    """{(mask, family, entry): median ms}, every (mask, family, entry) timed once per round."""
    calls = {}
    inputs = {family: score_sign_inputs(family) for family in FAMILIES}
    for mask in MASKS:
        for family, (q, k, v) in inputs.items():
            for entry, fn in _entries(q, k, v, mask).items():
                calls[(mask, family, entry)] = fn
    keys = list(calls)
    times = {key: [] for key in keys}
    for r in range(rounds):
        for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
            times[key].append(gpu_ms_queued(calls[key]))
    return {key: statistics.median(t) for key, t in times.items()}


def markdown(ms, rounds: int) -> str:
    lines = [
        "sm90 forward on rows of negative scores: b=2 h=16 s=8k d=128 bshd bf16; ms per call"
        f" (median of {rounds} rounds, queued) and the ratio to the ordinary inputs",
        "",
        "| mask | entry | " + " | ".join(FAMILIES) + " |",
        "|---|---|" + "---|" * len(FAMILIES),
    ]
    for mask in MASKS:
        for entry in ENTRIES:
            base = ms.get((mask, "ordinary", entry))
            cells = []
            for family in FAMILIES:
                t = ms.get((mask, family, entry))
                if t is None:
                    cells.append("-")
                elif family == "ordinary" or base is None:
                    cells.append(f"{t:.3f}")
                else:
                    cells.append(f"{t:.3f} ({t / base:.3f}x)")
            lines.append(f"| {mask} | {entry} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if not kernels.backend_available("cuda"):
        print("the CUDA backend is not available here (needs the sm_90a kernel and an sm90 GPU)")
        return 1
    ms = speed_table(args.rounds)
    table = markdown(ms, args.rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sm90_score_signs.md").write_text(table)
    payload = dict(
        device=torch.cuda.get_device_name(),
        rounds=args.rounds,
        results=[dict(mask=m, family=f, entry=e, ms=t) for (m, f, e), t in ms.items()],
    )
    (args.out / "sm90_score_signs.json").write_text(json.dumps(payload, indent=2))
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
