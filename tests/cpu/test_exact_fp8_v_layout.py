"""The launcher's V8^T layout: every sequence starts at a 16-token aligned column (CPU, torch).

The kernel reads FP8 V^T tiles through TMA boxes, which start on 16-byte boundaries, so
attention._quantize_v moves the columns of sequences whose tokens do not start on the 16-token grid
(thd packs with arbitrary cu_seqlens, dense layouts whose s is not a multiple of 16). These tests
check the move bitwise against the quantizer's own output, with the quantizer's torch path.
"""

import pytest
import torch

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import (
    attention,
    quantize,
    vt_layout,
)

H_KV, D = 2, 64


def _bits(x):
    return x.view(torch.uint8)


def _quantized(v, qkv_format, seqs, recipe):
    """(_quantize_v's output, the quantizer's own V8^T in token columns)."""
    laid_out = attention._quantize_v(v, qkv_format, seqs, recipe, False, 0.0)
    cu_seqlens = seqs.cu_kv_start if seqs.varlen else None
    if recipe == "mxfp8":
        own = quantize.per_chunk_cast_to_mxfp8_columnwise_transposed(
            v, qkv_format=qkv_format, cu_seqlens=cu_seqlens, backend="torch"
        )
    else:
        own = quantize.per_chunk_channel_cast_to_fp8_transposed(
            v, qkv_format=qkv_format, cu_seqlens=cu_seqlens, backend="torch"
        )
    return laid_out, own


def _check_moved(laid_out, own, starts):
    v8t, scales, cu_chunks, cu_vt = laid_out
    assert torch.equal(scales, own[1]) and torch.equal(cu_chunks, own[2])
    cols = cu_vt.tolist()
    assert cols == vt_layout.aligned_column_starts(torch.tensor(starts)).tolist()
    assert all(c % 16 == 0 for c in cols) and cols[0] == 0
    assert v8t.shape[-1] % 16 == 0 and v8t.shape[-1] >= cols[-1]
    expected = torch.zeros_like(_bits(v8t))
    for n, (a, b) in enumerate(zip(starts, starts[1:])):
        assert cols[n + 1] - cols[n] >= b - a
        expected[..., cols[n] : cols[n] + b - a] = _bits(own[0])[..., a:b]
    assert torch.equal(_bits(v8t), expected)


@pytest.mark.parametrize("recipe", ["current", "mxfp8"])
def test_thd_sequences_move_to_aligned_columns(recipe):
    cu = torch.tensor([0, 5, 70, 70, 133, 200], dtype=torch.int32)
    v = torch.randn(200, H_KV, D, generator=torch.Generator().manual_seed(0)).bfloat16()
    q = torch.zeros(200, 2 * H_KV, D, dtype=torch.bfloat16)
    seqs = attention._sequences(q, v, "thd", "padding_causal", cu, cu, None, None, None)
    assert seqs.vt_layout == (240, 80)
    _check_moved(*_quantized(v, "thd", seqs, recipe), cu.tolist())


@pytest.mark.parametrize("qkv_format", ["bshd", "sbhd"])
def test_dense_samples_move_to_aligned_columns(qkv_format):
    b, s = 3, 37
    shape = (b, s, H_KV, D) if qkv_format == "bshd" else (s, b, H_KV, D)
    v = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).bfloat16()
    seqs = attention._sequences(v, v, qkv_format, "causal", None, None, None, None, None)
    assert seqs.vt_layout == (144, 48)
    _check_moved(*_quantized(v, qkv_format, seqs, "current"), [0, s, 2 * s, 3 * s])


def test_aligned_starts_keep_the_quantizer_layout():
    cu = torch.tensor([0, 16, 16, 160, 173], dtype=torch.int32)  # only the end is off the grid
    v = torch.randn(173, H_KV, D, generator=torch.Generator().manual_seed(2)).bfloat16()
    seqs = attention._sequences(v, v, "thd", "padding_causal", cu, cu, None, None, None)
    assert seqs.vt_layout is None
    (v8t, _, _, cu_vt), own = _quantized(v, "thd", seqs, "current")
    assert torch.equal(_bits(v8t), _bits(own[0])) and torch.equal(cu_vt, cu)
