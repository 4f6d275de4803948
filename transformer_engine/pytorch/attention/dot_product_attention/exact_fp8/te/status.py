"""Did mask-exact FP8 attention run? A per-process record that users and tests can query.

    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.te import status
    status.reset()
    ... train or run the model under autocast(recipe=Float8CurrentScaling(fp8_dpa=True)) ...
    s = status.status()
    s.mask_exact_calls, s.last_kernel_backend, s.last_recipe, s.fallbacks  # reason -> count

`te/backend.py` records every DotProductAttention call that asked for mask-exact FP8 attention:
`record_run` when the mask-exact kernels ran it, `record_fallback` when it ran BF16/FP16
attention instead. The first run of the process logs one INFO line on TE's DotProductAttention
logger (shown with NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=1); a later change of recipe or kernel backend
logs a debug line. A fallback for a missing dependency (`MISSING_DEPENDENCIES`: Triton, the
CUDA extension) logs a WARNING the first time per process and reason, since a whole run would
otherwise train without FP8 attention unnoticed; every other fallback, and later calls, log at
debug level, as TE logs its backend selection.

Calls that did not ask for mask-exact FP8 attention (autocast off, fp8_dpa=False, the field off,
DelayedScaling) are not recorded. Counts are of forward calls; a CUDA graph replay is not a call.
"""

import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

__all__ = [
    "MISSING_DEPENDENCIES",
    "TRITON_MISSING",
    "EXTENSION_MISSING",
    "DISABLED",
    "MaskExactStatus",
    "status",
    "reset",
    "record_run",
    "record_fallback",
]

TRITON_MISSING = "Triton is not installed"
EXTENSION_MISSING = "the CUDA extension transformer_engine_exact_fp8 is not built"
MISSING_DEPENDENCIES: Dict[str, str] = {
    TRITON_MISSING: "install it (pip install triton; TE's CUDA builds of PyTorch bring it)",
    EXTENSION_MISSING: (
        "reinstall the fork on a machine with nvcc and NVTE_FORK_REQUIRE_EXT=1"
        " (docs/building.md, 'Prerequisites')"
    ),
}
"""Fallback reasons that are a missing dependency, and how to install it."""

DISABLED = "Disabling mask-exact FP8 attention for %s; running BF16/FP16 attention instead"


@dataclass(frozen=True)
class MaskExactStatus:
    """A snapshot of the record since the process started (or since `reset`).

    mask_exact_calls: calls the mask-exact kernels ran. fallbacks: reason -> number of calls that
    asked for mask-exact FP8 attention and ran BF16/FP16 attention instead. last_kernel_backend
    and last_recipe: of the last call that ran mask-exact (None before the first)."""

    mask_exact_calls: int = 0
    fallbacks: Dict[str, int] = field(default_factory=dict)
    last_kernel_backend: Optional[str] = None
    last_recipe: Optional[str] = None

    @property
    def fallback_calls(self) -> int:
        return sum(self.fallbacks.values())

    @property
    def ran_mask_exact(self) -> bool:
        return self.mask_exact_calls > 0


_lock = threading.Lock()
_calls = 0
_fallbacks: Dict[str, int] = {}
_last: Dict[str, Optional[str]] = {"kernel_backend": None, "recipe": None}
_announced = False  # the INFO line of the first run (once per process, not reset)
_warned: set = set()  # missing-dependency reasons already warned about (not reset)


def status() -> MaskExactStatus:
    """The record so far (a copy)."""
    with _lock:
        return MaskExactStatus(
            mask_exact_calls=_calls,
            fallbacks=dict(_fallbacks),
            last_kernel_backend=_last["kernel_backend"],
            last_recipe=_last["recipe"],
        )


def reset() -> None:
    """Zero the counts and forget the last kernel. The once-per-process log lines stay logged."""
    global _calls
    with _lock:
        _calls = 0
        _fallbacks.clear()
        _last.update(kernel_backend=None, recipe=None)


def record_run(kernel_backend: str, recipe: str, logger: Any) -> None:
    """A call ran the mask-exact kernels; the first of the process logs one INFO line."""
    global _calls, _announced
    with _lock:
        _calls += 1
        changed = (_last["kernel_backend"], _last["recipe"]) != (kernel_backend, recipe)
        _last.update(kernel_backend=kernel_backend, recipe=recipe)
        first, _announced = not _announced, True
    if first:
        logger.info(
            "Running with mask-exact FP8 attention (recipe %s, kernel backend %s); logged once"
            " per process, exact_fp8.te.status.status() counts the calls",
            recipe,
            kernel_backend,
        )
    elif changed:  # later changes at debug level, as TE logs a changed backend selection
        logger.debug(
            "Running with mask-exact FP8 attention (recipe %s, kernel backend %s)",
            recipe,
            kernel_backend,
        )


def record_fallback(reason: str, logger: Any) -> None:
    """A call asked for mask-exact FP8 attention and runs BF16/FP16 attention for `reason`."""
    with _lock:
        _fallbacks[reason] = _fallbacks.get(reason, 0) + 1
        warn = reason in MISSING_DEPENDENCIES and reason not in _warned
        if warn:
            _warned.add(reason)
    if warn:
        logger.warning(
            DISABLED + ": %s. FP8 attention stays off in this process (logged once per reason).",
            reason,
            MISSING_DEPENDENCIES[reason],
        )
    else:
        logger.debug(DISABLED, reason)
