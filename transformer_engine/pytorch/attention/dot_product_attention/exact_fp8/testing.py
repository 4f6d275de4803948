"""Numeric helpers shared by the tests, the benchmarks and the causality audit."""

from typing import Tuple

import torch

__all__ = ["prefix_change", "rel_frobenius_error", "cosine_similarity"]


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
