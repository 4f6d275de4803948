"""Reference backward of mask-exact FP8 attention, pure PyTorch (fp64): the oracle of the Triton
backward (triton/backward.py).

The gradients are those of Note [Backward of the FP8 forward] (te/autograd.py): the attention of
the forward's quantized Q and K (dequantized exactly, fp64), unquantized V and dO, and the
forward's own output O in D = rowsum(dO * O) (the straight-through estimate):

  P = softmax(S) over the visible positions, S = Q_dq . K_dq^T * softmax_scale
  dV = P^T . dO     dP = dO . V^T     dS = P * (dP - D)
  dQ = dS . K_dq * softmax_scale      dK = dS^T . Q_dq * softmax_scale   (GQA: summed per group)

Rows that see nothing, and positions past a sequence's real length, get zero gradients.
"""

from typing import Optional, Tuple

import torch

from ..formats import check_recipe
from ..masks import SeqLayout, check_mask_type, from_tokens, sequence_masks, to_tokens
from .attention import QuantConfig, dequantized_operands

__all__ = ["reference_attention_backward", "sequence_layouts"]


def sequence_layouts(
    q: torch.Tensor,
    k: torch.Tensor,
    qkv_format: str,
    attn_mask_type: str,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_kv: Optional[torch.Tensor] = None,
    cu_seqlens_q_padded: Optional[torch.Tensor] = None,
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
) -> Tuple[SeqLayout, SeqLayout]:
    """The kernels' reading of the sequence arguments: thd from cu_seqlens (and the padded
    offsets); bshd/sbhd from the shapes, with the real lengths of cu_seqlens under the padding
    mask types."""
    if qkv_format == "thd":
        return (
            SeqLayout.varlen(cu_seqlens_q.cpu(), _cpu(cu_seqlens_q_padded)),
            SeqLayout.varlen(cu_seqlens_kv.cpu(), _cpu(cu_seqlens_kv_padded)),
        )
    b_dim, s_dim = (0, 1) if qkv_format == "bshd" else (1, 0)
    padding = "padding" in attn_mask_type
    lens = lambda cu: None if cu is None or not padding else (cu[1:] - cu[:-1]).tolist()
    return (
        SeqLayout.dense(q.shape[b_dim], q.shape[s_dim], lens(cu_seqlens_q)),
        SeqLayout.dense(k.shape[b_dim], k.shape[s_dim], lens(cu_seqlens_kv)),
    )


def _cpu(x):
    return None if x is None else x.cpu()


def reference_attention_backward(
    recipe: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    d_out: torch.Tensor,
    *,
    qkv_format: str = "bshd",
    attn_mask_type: str = "causal",
    window_size: Optional[Tuple[int, int]] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_kv: Optional[torch.Tensor] = None,
    cu_seqlens_q_padded: Optional[torch.Tensor] = None,
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    quant: QuantConfig = QuantConfig(),
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in fp64 on the CPU, shaped as q, k, v, of the straight-through backward
    (module doc). recipe "current" or "mxfp8"; out: the forward's output, d_out its gradient.
    Sequence arguments as the kernels take them (sequence_layouts)."""
    check_recipe(recipe)
    check_mask_type(attn_mask_type, window_size)
    layout_q, layout_kv = sequence_layouts(
        q, k, qkv_format, attn_mask_type, cu_seqlens_q, cu_seqlens_kv,
        cu_seqlens_q_padded, cu_seqlens_kv_padded,
    )  # fmt: skip
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    qt, kt, vt, ot, dot = (to_tokens(x.detach().cpu(), qkv_format) for x in (q, k, v, out, d_out))
    q_dq, k_dq, _ = dequantized_operands("fork-" + recipe, qt, kt, vt, layout_kv, quant)
    vt, ot, dot = (x.double() for x in (vt, ot, dot))
    dq, dk, dv = (torch.zeros(x.shape, dtype=torch.float64) for x in (qt, kt, vt))
    rep = qt.shape[1] // kt.shape[1]
    masks = sequence_masks(layout_q, layout_kv, attn_mask_type, window_size)
    for _, rows, cols, allowed in masks:
        qh, doh, oh = (x[rows].transpose(0, 1) for x in (q_dq, dot, ot))  # [h, sq, d]
        kh, vh = (x[cols].transpose(0, 1).repeat_interleave(rep, 0) for x in (k_dq, vt))
        seen = allowed.any(-1, keepdim=True)
        scores = (qh @ kh.transpose(1, 2) * softmax_scale).masked_fill(~allowed, -torch.inf)
        scores = torch.where(seen, scores, torch.zeros_like(scores))  # rows that see nothing
        p = torch.softmax(scores, dim=-1) * allowed
        real = allowed.any(-1)  # rows with something to see (padding rows see nothing)
        doh = doh * real[None, :, None]
        delta = torch.where(doh != 0, doh * oh, torch.zeros_like(oh)).sum(-1, keepdim=True)
        ds = p * (doh @ vh.transpose(1, 2) - delta)
        g_q = ds @ kh * softmax_scale
        g_k = (ds.transpose(1, 2) @ qh * softmax_scale).unflatten(0, (-1, rep)).sum(1)
        g_v = (p.transpose(1, 2) @ doh).unflatten(0, (-1, rep)).sum(1)
        dq[rows], dk[cols], dv[cols] = (x.transpose(0, 1) for x in (g_q, g_k, g_v))
    return tuple(
        from_tokens(g, qkv_format, like.detach().cpu()) for g, like in zip((dq, dk, dv), (q, k, v))
    )
