"""One ring step of mask-exact FP8 attention: the call TE's ring would make per step.

`kernel_step_forward(q, payload, section, ...)` runs kernels.attention_forward on the step's
query rows and the src rank's quantized K and V (payload.KVPayload, the launcher's kv_fp8), with
the step's mask (chunking.Section):

  diagonal        q (2 L rows) x K/V (2 L keys), attn_mask_type="causal" (top-left)
  lower-triangle  q (2 L rows) x the first L keys: attn_mask_type="padding" with every kv
                  sample's real length L, so the kernel reads the first chunk's K8/V8 tiles in
                  place (no copy) and treats the second chunk as padding it never reads
  upper-triangle  the second L rows of q (a strided view, no copy) x K/V (2 L keys), "no_mask"
  all             q x K/V, "no_mask" (no causal mask: every step alike)

It returns the step's partial (out, lse) in the kernel's conventions (out in q's dtype, lse
[h, b * rows] fp32, -inf and 0 for a row that sees nothing). With chunking.check_seqlen's lengths
only the diagonal step has boundary tiles; the others read FP8 V only, so a received payload (no
unquantized V) gets `unread_v`, a stand-in full of NaN that no tile reads (a read would show).

Every step function has the signature of StepForward; the oracle's version is
reference/context_parallel.py's reference_step_forward.
"""

from typing import Callable, Optional, Tuple

import torch

from .. import kernels
from .chunking import Section
from .payload import KVPayload

__all__ = ["StepForward", "step_mask", "query_rows", "stand_in", "unread_v", "kernel_step_forward"]

StepForward = Callable[[torch.Tensor, KVPayload, Section], Tuple[torch.Tensor, torch.Tensor]]
"""(local q, the step's K/V payload, the step's section) -> (partial out, partial lse)."""


def query_rows(q: torch.Tensor, section: Section, qkv_format: str) -> torch.Tensor:
    """The step's query rows of the local q: all, or the second half (a view)."""
    if section.q_half == "both":
        return q
    seq_dim = qkv_format.index("s")
    half = q.shape[seq_dim] // 2
    return q.narrow(seq_dim, half, half)


def step_mask(section: Section, batch: int, rows: int, keys: int, device) -> dict:
    """kernels.attention_forward's mask arguments for the step (keys: the payload's 2 L)."""
    if section.causal:
        return dict(attn_mask_type="causal")
    if section.kv_half == "both":
        return dict(attn_mask_type="no_mask")
    n = torch.arange(batch + 1, dtype=torch.int32, device=device)
    return dict(attn_mask_type="padding", cu_seqlens_q=n * rows, cu_seqlens_kv=n * (keys // 2))


def stand_in(shape, dtype, device, fill: float) -> torch.Tensor:
    """A tensor of `shape` that allocates one [d] row (strides 0 except d): for arguments the
    kernel takes for their shape only."""
    return torch.full(shape[-1:], fill, dtype=dtype, device=device).expand(shape)


def unread_v(payload: KVPayload, device) -> torch.Tensor:
    """The unquantized-V argument of a step without boundary tiles: NaN, never read."""
    return stand_in(payload.shape, payload.dtype, device, float("nan"))


def _q_fp8_rows(q_fp8, section: Section, batch: int):
    """A pre-quantized Q (token-major [h, b * s, ...]) cut to the step's rows."""
    if q_fp8 is None or section.q_half == "both":
        return q_fp8
    out = []
    for x in q_fp8:
        x = x.view(x.shape[0], batch, -1, *x.shape[2:])
        half = x.shape[2] // 2
        out.append(x[:, :, half:].reshape(x.shape[0], batch * half, *x.shape[3:]))
    return tuple(out)


def kernel_step_forward(
    q: torch.Tensor,
    payload: KVPayload,
    section: Section,
    *,
    softmax_scale: Optional[float] = None,
    use_power_2_scales: bool = False,
    amax_epsilon: float = 0.0,
    q_fp8=None,
    backend: Optional[str] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The step's partial (out, lse) from the fork's kernel (see the module doc).

    q: the local queries [b, 2 L, h, d] (bshd) or [2 L, b, h, d] (sbhd); q_fp8: the launcher's
    pre-quantized Q of the whole local q (the interpreter's route), or None."""
    fmt = payload.qkv_format
    batch = q.shape[fmt.index("b")]
    rows = query_rows(q, section, fmt)
    keys = payload.shape[fmt.index("s")]
    mask = step_mask(section, batch, rows.shape[fmt.index("s")], keys, q.device)
    v = payload.v if payload.v is not None else unread_v(payload, q.device)
    return kernels.attention_forward(
        rows,
        stand_in(payload.shape, payload.dtype, q.device, 0.0),
        v,
        backend=backend,
        recipe=payload.recipe,
        qkv_format=fmt,
        softmax_scale=softmax_scale,
        use_power_2_scales=use_power_2_scales,
        amax_epsilon=amax_epsilon,
        q_fp8=_q_fp8_rows(q_fp8, section, batch),
        kv_fp8=payload.kv_fp8,
        **mask,
    )
