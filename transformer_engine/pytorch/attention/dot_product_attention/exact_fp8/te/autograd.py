"""Autograd of mask-exact FP8 attention: the FP8 forward kernel and a BF16/FP16 backward.

Forward: kernels.attention_forward (the selected kernel backend), which returns the output O and the log-sum-exp
of each row (LSE). Backward, as upstream's NVTE_FP8_DPA_BWD=0 does for its FP8 forward (an FP8
forward, a high-precision backward), in one of two ways chosen per configuration (te/backend.py):

  "cudnn"      TE's fused attention backward (cuDNN, F16 sub-backend) fed with the forward's O and
               LSE, so no forward is run again. See Note [BF16 backward of the FP8 forward].
  "recompute"  where that backward does not support the configuration: unquantized attention
               (torch's scaled_dot_product_attention, the input dtype) recomputed under autograd.

# Note [BF16 backward of the FP8 forward]
#
# A flash-style backward recomputes P = exp(S - LSE) from Q, K and the forward's LSE. The LSE of
# the FP8 forward belongs to the scores of the *quantized* Q and K. Recomputing S from the
# unquantized Q and K pairs each score with an LSE that is off by that score's quantization
# error, and exp() amplifies it: a logit of 200 (an outlier pair) off by 6% gives P off by e^12.
# (Measured on the reference rules with 0.1% of Q, K, V elements scaled by 50: gradient errors of
# 0.3 for current scaling and 1e5 for MXFP8.) So the cuDNN backward gets Q and K quantized by
# the forward's own rules and dequantized to the input dtype (triton/qk_roundtrip.py): its P then
# matches the LSE, and the gradients are those of the attention of the quantized Q and K (the
# straight-through estimate, as upstream's FP8 backward computes them), within a few percent of
# the unquantized gradients (tests/pytorch/attention/test_exact_fp8_te.py states the tolerance).
# Dequantization is exact for power-of-two scales (MXFP8, use_power_2_scales); FP32 current
# scales round it to the input dtype (relative 2^-9 for BF16). V and O enter unchanged.
"""

import contextlib
import dataclasses
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .. import kernels
from ..masks import SeqLayout, sequence_masks, to_tokens

__all__ = [
    "AttentionCall",
    "MaskExactFP8AttentionFunc",
    "cudnn_backward",
    "lse_to_softmax_stats",
    "recompute_backward",
]


@dataclasses.dataclass(frozen=True)
class AttentionCall:
    """Everything one mask-exact attention call needs besides q, k, v (TE's argument names)."""

    recipe: str  # "current" | "mxfp8"
    use_power_2_scales: bool
    qkv_format: str  # "bshd" | "sbhd" | "thd"
    attn_mask_type: str
    window_size: Tuple[int, int]  # TE's (left, right), -1 = unbounded
    bottom_right_diagonal: bool
    softmax_scale: float
    max_seqlen_q: int
    max_seqlen_kv: int
    deterministic: bool
    backward: Optional[str]  # "cudnn" | "recompute" | None (no gradient needed)
    cu_seqlens_q: torch.Tensor  # [b + 1] int32 (bshd/sbhd: may hold more entries, see seqlens)
    cu_seqlens_kv: torch.Tensor
    cu_seqlens_q_padded: Optional[torch.Tensor] = None  # thd: where each sequence starts
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None

    def batch_size(self, q: torch.Tensor) -> int:
        if self.qkv_format == "thd":
            return self.cu_seqlens_q.numel() - 1
        return q.shape[0] if self.qkv_format == "bshd" else q.shape[1]

    def seqlens(self, batch: int) -> Tuple[torch.Tensor, ...]:
        """(cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded) as upstream's
        FusedAttention passes them: bshd/sbhd cu_seqlens cut to batch + 1 entries, and the padded
        offsets defaulting to cu_seqlens for thd and the padding masks."""
        cu_q, cu_kv = self.cu_seqlens_q[: batch + 1], self.cu_seqlens_kv[: batch + 1]
        pad_q, pad_kv = self.cu_seqlens_q_padded, self.cu_seqlens_kv_padded
        if self.qkv_format == "thd" or "padding" in self.attn_mask_type:
            pad_q = cu_q if pad_q is None else pad_q
            pad_kv = cu_kv if pad_kv is None else pad_kv
        return cu_q, cu_kv, pad_q, pad_kv

    def kernel_kwargs(self, batch: int) -> dict:
        cu_q, cu_kv, _, _ = self.seqlens(batch)
        return dict(
            recipe=self.recipe,
            qkv_format=self.qkv_format,
            attn_mask_type=self.attn_mask_type,
            window_size=self.window_size,
            cu_seqlens_q=cu_q,
            cu_seqlens_kv=cu_kv,
            cu_seqlens_q_padded=self.cu_seqlens_q_padded,
            cu_seqlens_kv_padded=self.cu_seqlens_kv_padded,
            max_seqlen_q=self.max_seqlen_q,
            max_seqlen_kv=self.max_seqlen_kv,
            softmax_scale=self.softmax_scale,
            use_power_2_scales=self.use_power_2_scales,
        )


class MaskExactFP8AttentionFunc(torch.autograd.Function):
    """out = mask-exact FP8 attention(q, k, v); gradients by call.backward (see the module doc)."""

    @staticmethod
    def forward(ctx, q, k, v, call: AttentionCall):  # pylint: disable=arguments-differ
        out, lse = kernels.attention_forward(q, k, v, **call.kernel_kwargs(call.batch_size(q)))
        if call.backward is not None:
            ctx.call = call
            ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, d_out):  # pylint: disable=arguments-differ
        q, k, v, out, lse = ctx.saved_tensors
        call = ctx.call
        d_out = d_out.contiguous()
        if call.backward == "cudnn":
            dq, dk, dv = cudnn_backward(q, k, v, out, d_out, lse, call)
        else:
            dq, dk, dv = recompute_backward(q, k, v, d_out, call)
        return dq, dk, dv, None


def lse_to_softmax_stats(
    lse: torch.Tensor,
    qkv_format: str,
    batch: int,
    max_seqlen_q: int,
    ragged: bool,
    cu_seqlens_q_padded: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """cuDNN's softmax stats (fp32, fused_attn_bwd's aux_ctx_tensors[0]) from the kernel's LSE.

    lse: [h, t_q] fp32, natural-log sum-exp of the scaled scores, token-major over the flattened
    (b, s) axis (thd: the packed axis), -inf for rows that see no key. Returns
      bshd/sbhd:                 [b, h, s_q, 1];
      thd, ragged stats:         [t_q, h, 1], one row per token (cuDNN >= 9.6, not sm120);
      thd, otherwise:            [b, h, max_seqlen_q, 1], row s of sequence n being token
                                 cu_seqlens_q_padded[n] + s.
    Rows that see no key get +inf, so that the backward's P = exp(S - stats) is 0 there.
    """
    stats = lse.masked_fill(torch.isneginf(lse), math.inf)  # [h, t_q]
    if qkv_format != "thd":
        return stats.view(stats.shape[0], batch, -1).transpose(0, 1).unsqueeze(-1).contiguous()
    if ragged:
        return stats.t().unsqueeze(-1).contiguous()
    starts = cu_seqlens_q_padded[:batch].to(device=lse.device, dtype=torch.int64)
    rows = starts.unsqueeze(1) + torch.arange(max_seqlen_q, device=lse.device)  # [b, max_seqlen_q]
    rows = rows.clamp(max=max(stats.shape[1] - 1, 0))
    return stats[:, rows].transpose(0, 1).unsqueeze(-1).contiguous()


def _ragged_stats(qkv_format: str) -> bool:
    """Does TE's cuDNN backward take thd stats per token ([t, h, 1])? Mirrors TE's own rule."""
    if qkv_format != "thd":
        return False
    from transformer_engine.pytorch.utils import get_cudnn_version, get_device_compute_capability

    return get_cudnn_version() >= (9, 6, 0) and get_device_compute_capability() != (12, 0)


def cudnn_backward(q, k, v, out, d_out, lse, call: AttentionCall):
    """dq, dk, dv from TE's fused attention backward (cuDNN, F16 sub-backend), fed with Q and K
    round-tripped through FP8, the forward's O and its LSE.
    See Note [BF16 backward of the FP8 forward].
    """
    from transformer_engine.pytorch.cpp_extensions.fused_attn import (
        FusedAttnBackend,
        fused_attn_bwd,
    )

    from ..triton.qk_roundtrip import fp8_roundtrip

    fmt = call.qkv_format
    batch = call.batch_size(q)
    cu_q, cu_kv, pad_q, pad_kv = call.seqlens(batch)
    q_deq, k_deq = (fp8_roundtrip(x, call.recipe, call.use_power_2_scales) for x in (q, k))
    stats = lse_to_softmax_stats(lse, fmt, batch, call.max_seqlen_q, _ragged_stats(fmt), pad_q)
    rng_state = torch.zeros(2, dtype=torch.int64, device=q.device)  # no dropout: never read
    layout = "_".join([fmt] * 3)
    dq, dk, dv, *_ = fused_attn_bwd(
        call.max_seqlen_q,
        call.max_seqlen_kv,
        cu_q,
        cu_kv,
        q_deq,
        k_deq,
        v.contiguous(),
        out,
        d_out,
        q.dtype,
        [stats, rng_state],
        FusedAttnBackend["F16_arbitrary_seqlen"],
        pad_q,
        pad_kv,
        attn_scale=call.softmax_scale,
        dropout=0.0,
        qkv_layout=layout,
        o_format=fmt,
        do_format=fmt,
        dqkv_layout=layout,
        attn_mask_type=call.attn_mask_type,
        window_size=call.window_size,
        bottom_right_diagonal=call.bottom_right_diagonal,
        deterministic=call.deterministic,
    )
    return dq, dk, dv


def recompute_backward(q, k, v, d_out, call: AttentionCall):
    """dq, dk, dv of unquantized attention (input dtype) recomputed under autograd.

    Rows that see no key (padding, or an empty bottom-right causal row) have output 0 and no
    gradient. Deterministic mode uses torch's math attention.
    """
    layout_q, layout_kv = _seq_layouts(q, k, call)
    with torch.enable_grad():
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        q_t, k_t, v_t = (to_tokens(x, call.qkv_format) for x in leaves)
        out, visible = _unquantized_attention(q_t, k_t, v_t, layout_q, layout_kv, call)
        d_out_t = to_tokens(d_out, call.qkv_format) * visible[:, None, None]
        return torch.autograd.grad(out, leaves, d_out_t)


def _seq_layouts(q, k, call: AttentionCall) -> Tuple[SeqLayout, SeqLayout]:
    batch = call.batch_size(q)
    cu_q, cu_kv, pad_q, pad_kv = call.seqlens(batch)
    if call.qkv_format == "thd":
        return SeqLayout.varlen(cu_q, pad_q), SeqLayout.varlen(cu_kv, pad_kv)
    s_dim = 1 if call.qkv_format == "bshd" else 0
    padding = "padding" in call.attn_mask_type
    lens_q = (cu_q[1:] - cu_q[:-1]).tolist() if padding else None
    lens_kv = (cu_kv[1:] - cu_kv[:-1]).tolist() if padding else None
    return (
        SeqLayout.dense(batch, q.shape[s_dim], lens_q),
        SeqLayout.dense(batch, k.shape[s_dim], lens_kv),
    )


def _unquantized_attention(q_t, k_t, v_t, layout_q, layout_kv, call: AttentionCall):
    """Token-major attention, one sequence at a time: out [t_q, h, d], visible [t_q] bool."""
    out = q_t.new_zeros(q_t.shape[:-1] + v_t.shape[-1:])
    visible = torch.zeros(q_t.shape[0], dtype=torch.bool, device=q_t.device)
    math_only = sdpa_kernel(SDPBackend.MATH) if call.deterministic else contextlib.nullcontext()
    with math_only:
        masks = sequence_masks(layout_q, layout_kv, call.attn_mask_type, call.window_size)
        for _, rows, cols, allowed in masks:
            seen = allowed.any(dim=-1)
            if not bool(seen.any()):
                continue
            allowed[~seen, 0] = True  # a finite softmax; these rows get no gradient
            o = F.scaled_dot_product_attention(
                q_t[rows].transpose(0, 1),
                k_t[cols].transpose(0, 1),
                v_t[cols].transpose(0, 1),
                attn_mask=allowed.to(q_t.device),
                scale=call.softmax_scale,
                enable_gqa=True,
            )
            out[rows] = o.transpose(0, 1)
            visible[rows] = seen.to(q_t.device)
    return out, visible
