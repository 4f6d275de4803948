"""Autograd of mask-exact FP8 attention: the FP8 forward kernel and the fork's own backward.

Forward: kernels.attention_forward (the selected kernel backend), which returns the output O and
the log-sum-exp of each row (LSE). Backward: kernels.attention_backward (the sm90 CUDA backward
where it runs the call, the Triton backward otherwise; docs/backward.md), from Q, K, V, O and
the LSE the forward saved.

# Note [Backward of the FP8 forward]
#
# A flash-style backward recomputes P = exp(S - LSE) from Q, K and the forward's LSE. The LSE of
# the FP8 forward belongs to the scores of the *quantized* Q and K, so the backward must
# recompute exactly those scores: paired with any other scores (the unquantized Q and K, or the
# quantized ones dequantized to BF16 and multiplied in another precision), exp() amplifies the
# difference. A logit of 200 (an outlier pair) off by 6% gives P off by e^12; and where tokens
# hold large finite values (scores of 1e9 and more), the scores of two precisions differ by far
# more than the ~88 that exp() can take, P overflows to inf for rows whose dO is 0, and
# inf * 0 = NaN lands in the gradients of every position those rows see: a future token then
# changes a prefix gradient, which BF16 attention's backward never does. (Measured: the cuDNN
# BF16 backward fed the FP8 forward's LSE and round-tripped Q, K turned the prefix gradients
# non-finite for future Q scaled by 3e4, K by 1e7, or random values up to 3e7; issue 21.)
#
# So the backward recomputes S from the forward's own FP8 operands: Q and K quantized again by
# the forward's quantizer (per-token cast, the same bits: a deterministic function of each
# token), multiplied in FP8 with the forward kernel's scale arithmetic (triton/backward_kernel.py
# _scores). P = 2^(S - LSE2) is then at most 1 up to the rounding of the LSE and of the MMA's
# accumulation order, and is clamped to [0, 1]; a hidden position is removed with tl.where,
# never by a multiplication; padding is never loaded. The gradients are those of the attention
# of the quantized Q and K (the straight-through estimate, as upstream's FP8 backward computes
# them): dQ = dS . K_dq, dK = dS^T . Q_dq with Q_dq, K_dq the dequantized FP8 operands, rounded
# to the input dtype for the 16-bit MMAs (exact for power-of-two scales, MXFP8 and
# use_power_2_scales, unless they fall under the dtype's subnormals; FP32 current scales round
# them, relative 2^-9 for BF16); V, dO and the forward's O (in D = rowsum(dO * O)) enter
# unchanged. They are within a few percent of the unquantized gradients
# (tests/pytorch/attention/test_exact_fp8_backward.py states the tolerance and its reasoning).
"""

import dataclasses
from typing import Optional, Tuple

import torch

from .. import kernels

__all__ = ["AttentionCall", "MaskExactFP8AttentionFunc"]


@dataclasses.dataclass(frozen=True)
class AttentionCall:
    """Everything one mask-exact attention call needs besides q, k, v (TE's argument names)."""

    recipe: str  # "current" | "mxfp8"
    use_power_2_scales: bool
    qkv_format: str  # "bshd" | "sbhd" | "thd"
    attn_mask_type: str
    window_size: Tuple[int, int]  # TE's (left, right), -1 = unbounded
    softmax_scale: float
    max_seqlen_q: int
    max_seqlen_kv: int
    requires_grad: bool  # save what the backward needs
    cu_seqlens_q: torch.Tensor  # [b + 1] int32 (bshd/sbhd: may hold more entries, see seqlens)
    cu_seqlens_kv: torch.Tensor
    cu_seqlens_q_padded: Optional[torch.Tensor] = None  # thd: where each sequence starts
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None

    def batch_size(self, q: torch.Tensor) -> int:
        if self.qkv_format == "thd":
            return self.cu_seqlens_q.numel() - 1
        return q.shape[0] if self.qkv_format == "bshd" else q.shape[1]

    def seqlens(self, batch: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(cu_seqlens_q, cu_seqlens_kv) cut to batch + 1 entries (TE's bshd/sbhd cu_seqlens may
        hold more)."""
        return self.cu_seqlens_q[: batch + 1], self.cu_seqlens_kv[: batch + 1]

    def kernel_kwargs(self, batch: int) -> dict:
        """The kernels' keyword arguments. cu_seqlens go along only where the mask reads them
        (thd, padding masks): a dense call without them is one the sm90 CUDA kernel can run
        (kernels.choose_backend), and no launcher reads them for dense calls."""
        if self.qkv_format == "thd" or "padding" in self.attn_mask_type:
            cu_q, cu_kv = self.seqlens(batch)
        else:
            cu_q = cu_kv = None
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
    """out = mask-exact FP8 attention(q, k, v); gradients by kernels.attention_backward (see
    Note [Backward of the FP8 forward])."""

    @staticmethod
    def forward(ctx, q, k, v, call: AttentionCall):  # pylint: disable=arguments-differ
        out, lse = kernels.attention_forward(q, k, v, **call.kernel_kwargs(call.batch_size(q)))
        if call.requires_grad:
            ctx.call = call
            ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, d_out):  # pylint: disable=arguments-differ
        q, k, v, out, lse = ctx.saved_tensors
        call = ctx.call
        kwargs = call.kernel_kwargs(call.batch_size(q))
        dq, dk, dv = kernels.attention_backward(q, k, v, out, d_out, lse, **kwargs)
        return dq, dk, dv, None
