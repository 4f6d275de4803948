"""Numeric helpers shared by the tests, the benchmarks and the causality audit."""

import statistics
import time
from typing import Callable, List, Tuple

import torch

__all__ = [
    "prefix_change", "rel_frobenius_error", "cosine_similarity", "aligned_columns_reference",
    "host_us_per_call",
]  # fmt: skip


def prefix_change(
    base: torch.Tensor, perturbed: torch.Tensor, protected: torch.Tensor
) -> Tuple[float, int]:
    """(max |difference|, number of elements that differ bitwise) over the protected rows.

    base/perturbed: [t, h, d] token-major outputs; protected: [t] bool. NaN compares as changed.
    """
    a, b = base[protected], perturbed[protected]
    changed = ~((a == b) | (torch.isnan(a) & torch.isnan(b)))
    diff = (a.double() - b.double()).abs()
    max_abs = float(diff.nan_to_num(nan=float("inf")).max()) if diff.numel() else 0.0
    return max_abs, int(changed.sum())


def rel_frobenius_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F in fp64."""
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


def cosine_similarity(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Cosine of the angle between the flattened tensors, in fp64."""
    out, ref = out.double().flatten(), ref.double().flatten()
    return float(out @ ref / (out.norm() * ref.norm()))


def aligned_columns_reference(
    v8t: torch.Tensor, starts: List[int]
) -> Tuple[torch.Tensor, List[int]]:
    """The aligned layout (vt_layout) of a plain V8^T, built slice by slice: (bytes [h, d, width]
    uint8, each sequence's first column). v8t [h, d, t_pad] FP8 with sequence n in the columns
    [starts[n], starts[n + 1]); each span goes to the next multiple of 16, the rest is 0."""
    spans = [b - a for a, b in zip(starts, starts[1:])]
    cols = [0]
    for span in spans:
        cols.append(cols[-1] + (span + 15) // 16 * 16)
    src = v8t.view(torch.uint8)
    out = torch.zeros(src.shape[:-1] + (cols[-1],), dtype=torch.uint8)
    for n, span in enumerate(spans):
        out[..., cols[n] : cols[n] + span] = src[..., starts[n] : starts[n] + span].cpu()
    return out, cols


def host_us_per_call(fn: Callable[[], object], calls: int = 200, repeats: int = 3) -> float:
    """Host (CPU) microseconds per call of fn, calls issued back to back (median of `repeats`):
    what a call costs where the GPU work is too small to hide it. fn runs once before timing."""
    fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)
