"""Mask-exact FP8 attention as a backend of TE's own selection, `get_attention_backend`.

Patch 0005 makes upstream's `dot_product_attention.utils.get_attention_backend(attention_params)`
ask `select(attention_params)` first:

  * a configuration the fork runs mask-exact (backend.mask_exact_decision): get_attention_backend
    returns `mask_exact_backend()`, i.e. the FusedAttention slot with the marker
    `MASK_EXACT_FP8_BACKEND` as its sub-backend:

        (use_flash_attention=False, flash_attention_backend=None,
         use_fused_attention=True, fused_attention_backend=MASK_EXACT_FP8_BACKEND,
         use_unfused_attention=False, available_backends=[False, True, False])

    The kernels are one fused forward, and DotProductAttention.forward runs them before it would
    read the selection (patch 0003), so no FusedAttention (cuDNN) call ever receives the marker.
    The marker is an int of value -1, cuDNN's `No_Backend` (no cuDNN sub-backend runs the call),
    so `int()` and `FusedAttnBackend` comparisons behave; `is_mask_exact_backend(value)` tells it
    from the real sub-backends, and its str() names the fork's kernels;
  * a configuration that asks for mask-exact FP8 attention but falls back: upstream's selection
    continues with fp8=False, since BF16/FP16 attention is what runs;
  * anything else (not asked, or a request DotProductAttention refuses with an error):
    upstream's selection, unchanged.

Upstream's own tests and helpers that ask which backend a configuration gets (e.g. current
scaling FP8 attention on sm90, where upstream answers "no backend") thus see the fork's backend.
Nothing is recorded in te/status.py: a selection is a question, not a call.
"""

import dataclasses
import logging
from typing import Any, Optional, Tuple

from .. import kernels
from . import backend

__all__ = [
    "MaskExactFP8Backend",
    "MASK_EXACT_FP8_BACKEND",
    "is_mask_exact_backend",
    "mask_exact_backend",
    "Selection",
    "select",
]

_LOGGER = logging.getLogger("DotProductAttention")


class MaskExactFP8Backend(int):
    """The `fused_attention_backend` value that stands for mask-exact FP8 attention: -1 as an int
    (cuDNN's No_Backend: no cuDNN sub-backend runs the call), named in str() and repr()."""

    NAME = "mask-exact FP8 attention (exact_fp8)"

    def __new__(cls):
        return super().__new__(cls, -1)

    def __str__(self) -> str:
        return self.NAME

    __repr__ = __str__


MASK_EXACT_FP8_BACKEND = MaskExactFP8Backend()


def is_mask_exact_backend(fused_attention_backend: Any) -> bool:
    """Is a get_attention_backend `fused_attention_backend` the mask-exact FP8 marker?"""
    return isinstance(fused_attention_backend, MaskExactFP8Backend)


def mask_exact_backend() -> Tuple[bool, Any, bool, Any, bool, list]:
    """get_attention_backend's return value for a call the fork runs mask-exact."""
    return False, None, True, MASK_EXACT_FP8_BACKEND, False, [False, True, False]


@dataclasses.dataclass(frozen=True)
class Selection:
    """What get_attention_backend does with one AttentionParams.

    backend: its return value when the fork runs the configuration mask-exact, else None.
    attention_params: what upstream's selection continues with otherwise (fp8=False where the
    fork falls back to BF16/FP16 attention)."""

    attention_params: Any
    backend: Optional[tuple] = None


def select(
    attention_params: Any, *, device_support: Optional[dict] = None, logger: Any = None
) -> Selection:
    """See the module doc. device_support: backend.unsupported_reason's machine description
    (default: this machine's)."""
    logger = logger or _LOGGER
    try:
        decision = backend.mask_exact_decision(
            attention_params, device_support=device_support, logger=logger
        )
    except ValueError as err:
        logger.debug(
            "Mask-exact FP8 attention refuses this configuration (%s); DotProductAttention"
            " raises for it",
            str(err).split(":")[0],
        )
        return Selection(attention_params)
    if not decision.asked:
        return Selection(attention_params)
    if not decision.runs:
        logger.debug(backend.status.DISABLED, decision.reason)
        return Selection(dataclasses.replace(attention_params, fp8=False))
    logger.debug(
        "Available backends = {%s (recipe %s, kernel backend %s)}",
        MASK_EXACT_FP8_BACKEND,
        decision.kernel_recipe,
        kernels.select_backend(),
    )
    logger.debug("Selected backend = FusedAttention slot: %s.", MASK_EXACT_FP8_BACKEND)
    return Selection(attention_params, mask_exact_backend())
