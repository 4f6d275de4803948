"""The oracle of one context-parallel ring step, and of its backward (fp64, CPU).

reference_step_forward has the signature of context_parallel.steps.StepForward: it computes the
step's section (chunking.Section) with the fork's rules through reference_attention, reading K
and V from the step's payload (payload.KVPayload.dequantize: the bits that travel) and the
unquantized V only where the payload still holds it (its own rank's); a received payload's step
must use FP8 V on every tile (checked: the unquantized V does not travel). reference_step_backward has the signature of
context_parallel.ring.StepBackward: the exact attention gradients of one step given the merged
forward's output and LSE.
"""

import torch

from ..context_parallel.chunking import Section
from ..context_parallel.payload import KVPayload
from ..context_parallel.steps import query_rows
from ..formats import KV_TILE
from ..masks import bshd_view, to_tokens
from .attention import QuantConfig, reference_attention
from .quantize import (
    dequantize,
    dequantize_mxfp8_rowwise,
    per_block_cast_to_mxfp8_rowwise,
    per_token_cast_to_fp8,
)

__all__ = ["reference_step_forward", "reference_step_backward"]


def reference_step_forward(
    q: torch.Tensor,
    payload: KVPayload,
    section: Section,
    *,
    softmax_scale=None,
    quant: QuantConfig = QuantConfig(),
    q_fp8=None,
):
    """The step's partial (out in q's dtype, lse [h, b * rows] fp32), as kernel_step_forward.
    q_fp8 is accepted for the signature and not needed (the reference quantizes Q itself)."""
    del q_fp8
    fmt = payload.qkv_format
    path = "fork-" + payload.recipe
    rows = query_rows(q, section, fmt)
    batch = q.shape[fmt.index("b")]
    keys = payload.shape[fmt.index("s")]
    received = payload.v is None
    v = torch.zeros(payload.shape, dtype=payload.dtype) if received else payload.v.cpu()
    k_like = torch.zeros(payload.shape, dtype=payload.dtype)
    kwargs = dict(qkv_format=fmt, attn_mask_type="causal" if section.causal else "no_mask")
    if section.kv_half == "first":
        n_rows = rows.shape[fmt.index("s")]
        kwargs.update(
            attn_mask_type="padding", seqlens_q=[n_rows] * batch, seqlens_kv=[keys // 2] * batch
        )
    q_t = to_tokens(rows.detach().cpu(), fmt)
    q_deq = _quantized_q(q_t, payload.recipe, quant)
    k_deq, v_deq = payload.dequantize()
    res = reference_attention(
        path, rows.cpu(), k_like, v, softmax_scale=softmax_scale, quant=quant,
        operands=(q_deq, k_deq, v_deq), **kwargs,
    )  # fmt: skip
    seen_tiles = -(-(keys // 2 if section.kv_half == "first" else keys) // KV_TILE)
    if received and not all(bool(t[:, :seen_tiles].all()) for t in res.fp8_tiles):
        raise AssertionError(f"{section.name}: a boundary tile needs the unquantized V it lacks")
    return res.out.to(q.device), res.lse.float().to(q.device)


def _quantized_q(q_t: torch.Tensor, recipe: str, quant: QuantConfig) -> torch.Tensor:
    """Q [t, h, d] by the fork's rules, dequantized in fp64 (as reference_attention's own)."""
    if recipe == "mxfp8":
        return dequantize_mxfp8_rowwise(*per_block_cast_to_mxfp8_rowwise(q_t))
    kw = dict(use_power_2_scales=quant.use_power_2_scales, amax_epsilon=quant.amax_epsilon)
    data, scale_inv = per_token_cast_to_fp8(q_t, **kw)
    return dequantize(data, scale_inv.unsqueeze(-1))


def _heads_first(x: torch.Tensor, qkv_format: str) -> torch.Tensor:
    """[b, n, h, d] (bshd) or [n, b, h, d] (sbhd) -> [b, h, n, d] fp64."""
    return bshd_view(x, qkv_format).double().permute(0, 2, 1, 3)


def _back(x: torch.Tensor, qkv_format: str) -> torch.Tensor:
    return bshd_view(x.permute(0, 2, 1, 3), qkv_format)


def reference_step_backward(
    q, k, v, out, dout, lse, causal, *, qkv_format="bshd", softmax_scale=None
):
    """(dq, dk, dv) fp64 of one step: P = exp(S * scale - lse) with the merged lse ([h, b * n]),
    D = rowsum(dO * O) with the merged O, dS = P * (dO V^T - D); top-left causal when `causal`.
    GQA: dk, dv summed over each kv-head's query heads."""
    qh, kh, vh, oh, doh = (_heads_first(x, qkv_format) for x in (q, k, v, out, dout))
    b, h, n_q, d = qh.shape
    rep = h // kh.shape[1]
    kh, vh = (x.repeat_interleave(rep, dim=1) for x in (kh, vh))
    scale = d**-0.5 if softmax_scale is None else softmax_scale
    s = qh @ kh.transpose(-1, -2) * scale
    if causal:
        hidden = torch.ones(n_q, kh.shape[2], dtype=torch.bool).triu(1)
        s = s.masked_fill(hidden, float("-inf"))
    lse = lse.double().view(h, b, n_q).permute(1, 0, 2).unsqueeze(-1)
    p = torch.where(torch.isneginf(lse), torch.zeros_like(s), torch.exp(s - lse))
    dv = p.transpose(-1, -2) @ doh
    dp = doh @ vh.transpose(-1, -2)
    ds = p * (dp - (doh * oh).sum(-1, keepdim=True))
    dq = ds @ kh * scale
    dk = ds.transpose(-1, -2) @ qh * scale
    dk, dv = (x.unflatten(1, (h // rep, rep)).sum(2) for x in (dk, dv))
    return _back(dq, qkv_format), _back(dk, qkv_format), _back(dv, qkv_format)
