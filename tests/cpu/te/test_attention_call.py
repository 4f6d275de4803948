"""AttentionCall.kernel_kwargs: what TE's call hands the kernels (no TE core library needed)."""

import pytest
import torch

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.te.autograd import (
    AttentionCall,
)


def _call(qkv_format, mask):
    cu = torch.tensor([0, 128, 256, 384], dtype=torch.int32)  # TE's may hold more entries
    return AttentionCall(
        recipe="current", use_power_2_scales=False, qkv_format=qkv_format, attn_mask_type=mask,
        window_size=(-1, 0), softmax_scale=0.125, max_seqlen_q=128, max_seqlen_kv=128,
        requires_grad=False, cu_seqlens_q=cu, cu_seqlens_kv=cu,
    )  # fmt: skip


@pytest.mark.parametrize("qkv_format", ["bshd", "sbhd"])
@pytest.mark.parametrize("mask", ["causal", "no_mask", "causal_bottom_right"])
def test_dense_calls_carry_no_cu_seqlens(qkv_format, mask):
    """A dense call's cu_seqlens are not read by any launcher; without them the sm90 CUDA kernel
    may run it (kernels.choose_backend refuses calls that carry cu_seqlens)."""
    kw = _call(qkv_format, mask).kernel_kwargs(batch=2)
    assert kw["cu_seqlens_q"] is None and kw["cu_seqlens_kv"] is None


@pytest.mark.parametrize(
    "qkv_format, mask", [("bshd", "padding"), ("sbhd", "padding_causal"), ("thd", "padding_causal")]
)
def test_calls_whose_mask_reads_lengths_carry_them_cut_to_the_batch(qkv_format, mask):
    kw = _call(qkv_format, mask).kernel_kwargs(batch=2)
    expected = torch.tensor([0, 128, 256], dtype=torch.int32)
    assert torch.equal(kw["cu_seqlens_q"], expected) and torch.equal(kw["cu_seqlens_kv"], expected)
