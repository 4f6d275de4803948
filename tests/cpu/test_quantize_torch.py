"""CPU tests of the quantization API's torch path (quantize.py without the CUDA extension).

They pin the API's layouts (head-major Q/K outputs, transposed and padded V outputs, (b, s) token
order for sbhd, chunks restarting at every sequence, the aligned V layout and the column starts
the attention launcher passes with it) against the reference functions element by element, and
its error messages. No GPU and no TE core library needed.
"""

import functools

import pytest
import torch

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton import attention
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import (
    quantize as Q,
    vt_layout,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference import (
    quantize as ref,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.formats import (
    cast_to_e4m3,
    compute_scale_from_amax,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import SeqLayout
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.sequences import sequences
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
    aligned_columns_reference,
)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x.view(torch.int32)


def _x(*shape, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    scale = torch.pow(10.0, torch.empty(*shape[:-1], 1).uniform_(-3, 3, generator=gen))
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


def test_per_token_sbhd_is_head_major_in_b_s_order():
    x = _x(5, 2, 3, 64)  # sbhd [s, b, h, d]
    data, scale_inv = Q.per_token_cast_to_fp8(x, qkv_format="sbhd")
    assert data.shape == (3, 10, 64) and scale_inv.shape == (3, 10)
    for s, b, h in [(0, 0, 0), (4, 1, 2), (2, 1, 0)]:
        row = x[s, b, h].float()
        scale = compute_scale_from_amax(row.abs().amax())
        token = b * 5 + s
        assert torch.equal(_bits(data[h, token]), _bits(cast_to_e4m3(row * scale)))
        assert torch.equal(scale_inv[h, token], 1.0 / scale)


@pytest.mark.parametrize("qkv_format", ["bshd", "sbhd", "thd"])
def test_per_token_and_mx_rowwise_match_reference_transposed(qkv_format):
    x = _x(2, 3, 4, 64) if qkv_format != "thd" else _x(7, 4, 64)
    tokens = x.flatten(0, 1) if qkv_format == "bshd" else x
    if qkv_format == "sbhd":
        tokens = x.transpose(0, 1).flatten(0, 1)
    data, scale_inv = Q.per_token_cast_to_fp8(x, qkv_format=qkv_format, use_power_2_scales=True)
    ref_data, ref_scale_inv = ref.per_token_cast_to_fp8(tokens, use_power_2_scales=True)
    assert torch.equal(_bits(data), _bits(ref_data.transpose(0, 1)))
    assert torch.equal(scale_inv, ref_scale_inv.t())
    data, codes = Q.per_block_cast_to_mxfp8_rowwise(x, qkv_format=qkv_format)
    ref_data, ref_codes = ref.per_block_cast_to_mxfp8_rowwise(tokens)
    assert torch.equal(_bits(data), _bits(ref_data.transpose(0, 1)))
    assert torch.equal(codes, ref_codes.transpose(0, 1))


def test_per_chunk_bshd_chunks_restart_at_each_sample():
    v = _x(2, 70, 2, 64)  # 70 = 64 + 6: each sample has a full and a short chunk of 64
    data_t, scale_inv, cu_chunks = Q.per_chunk_cast_to_fp8_transposed(
        v, qkv_format="bshd", chunk=64
    )
    assert data_t.shape == (2, 64, 144)  # t = 140 padded to a multiple of 16
    assert scale_inv.shape == (2, 4) and cu_chunks.tolist() == [0, 2, 4]  # [h_kv, num_chunks]
    assert not _bits(data_t[:, :, 140:]).any()
    # chunk 3 = tokens 64..69 of sample 1 = columns 134..139; one scale per kv-head
    amax = v[1, 64:70].float().abs().amax(dim=(0, 2))  # [h]: over the chunk's tokens and d
    scale = compute_scale_from_amax(amax)
    assert torch.equal(scale_inv[:, 3], 1.0 / scale)
    expected = cast_to_e4m3(v[1, 64:70].float() * scale[:, None])  # [6, h, d]
    assert torch.equal(_bits(data_t[:, :, 134:140]), _bits(expected.permute(1, 2, 0)))


def test_per_chunk_thd_sequences_and_unowned_tail():
    v = _x(50, 2, 64, dtype=torch.float16)
    cu = torch.tensor([0, 10, 10, 45], dtype=torch.int32)  # an empty sequence; 45..49 unowned
    data_t, scale_inv, cu_chunks = Q.per_chunk_cast_to_fp8_transposed(
        v, qkv_format="thd", cu_seqlens=cu, chunk=16
    )
    assert data_t.shape == (2, 64, 64) and cu_chunks.tolist() == [0, 1, 1, 4]
    assert scale_inv.shape == (2, 4)
    ref_data, ref_scale_inv, _ = ref.per_chunk_cast_to_fp8(v[:45], SeqLayout.varlen(cu), chunk=16)
    assert torch.equal(_bits(data_t[:, :, :45]), _bits(ref_data.permute(1, 2, 0)))
    assert not _bits(data_t[:, :, 45:]).any()
    assert torch.equal(scale_inv, ref_scale_inv.transpose(0, 1))


@pytest.mark.parametrize("mx", [False, True])
@pytest.mark.parametrize(
    "qkv_format,starts", [("thd", [0, 5, 70, 70, 133, 200]), ("bshd", [0, 37, 74, 111])]
)
def test_aligned_columns_move_the_plain_layouts_bytes(mx, qkv_format, starts):
    """aligned_columns=True: the plain layout's bytes, each sequence on a 32-aligned column
    (vt_layout.SPAN_COLUMNS), zeros between; the scales and chunks are the same."""
    v = _x(starts[-1] + 9, 2, 64, dtype=torch.float16, seed=4)
    kw = dict(qkv_format="thd", cu_seqlens=torch.tensor(starts, dtype=torch.int32))
    if qkv_format == "bshd":
        v, kw = v[: starts[-1]].reshape(len(starts) - 1, starts[1], 2, 64), dict(qkv_format="bshd")
    cast = (
        Q.per_chunk_cast_to_mxfp8_columnwise_transposed
        if mx
        else Q.per_chunk_cast_to_fp8_transposed
    )
    plain = cast(v, **kw)
    aligned = cast(v, aligned_columns=True, **kw)
    expected, columns = aligned_columns_reference(plain[0], starts)
    assert columns == vt_layout.aligned_column_starts_list(starts)
    assert all(c % vt_layout.SPAN_COLUMNS == 0 for c in columns)
    assert torch.equal(aligned[0].view(torch.uint8), expected)
    assert torch.equal(aligned[1], plain[1])  # fp32 scale_inv or E8M0 codes, all finite
    assert torch.equal(aligned[2], plain[2])
    device_columns = vt_layout.aligned_column_starts(torch.tensor(starts, dtype=torch.int32))
    assert device_columns.tolist() == columns
    if qkv_format == "bshd":
        dense = vt_layout.dense_column_starts(len(starts) - 1, starts[1], torch.device("cpu"), True)
        assert dense.tolist() == columns


@pytest.mark.parametrize("batch", [1, 2, 3])
@pytest.mark.parametrize("seqlen", [1, 15, 16, 128, 200, 256])
def test_dense_needs_alignment_exactly_when_a_sample_starts_off_the_grid(batch, seqlen):
    starts = [n * seqlen for n in range(batch + 1)]
    off_grid = any(x % vt_layout.ALIGN_COLUMNS for x in starts[:-1])
    assert vt_layout.dense_needs_alignment(batch, seqlen) == off_grid
    # the aligned layout keeps every sample's first column exactly when all are on its grid
    on_span_grid = all(x % vt_layout.SPAN_COLUMNS == 0 for x in starts[:-1])
    same_starts = vt_layout.aligned_column_starts_list(starts)[:batch] == starts[:batch]
    assert same_starts == on_span_grid


# V8^T as the attention launcher lays it out (_quantize_v): sequences on 32-aligned columns


def _quantized_v(v, qkv_format, seqs, recipe):
    """(_quantize_v's output, the quantizer's plain V8^T: token i in column i)."""
    laid_out = attention._quantize_v(v, qkv_format, seqs, recipe, False, 0.0)
    cu_seqlens = seqs.cu_kv_start if seqs.varlen else None
    if recipe == "mxfp8":
        own = Q.per_chunk_cast_to_mxfp8_columnwise_transposed(
            v, qkv_format=qkv_format, cu_seqlens=cu_seqlens, backend="torch"
        )
    else:
        own = Q.per_chunk_cast_to_fp8_transposed(
            v, qkv_format=qkv_format, cu_seqlens=cu_seqlens, backend="torch"
        )
    return laid_out, own


def _check_aligned(laid_out, own, starts):
    """Scales untouched; each sequence's columns at a 32-aligned start, zeros elsewhere (also in
    the columns that thd's width bound adds; its extra scale rows are not compared)."""
    v8t, scales, cu_chunks, cu_vt = laid_out
    num_chunks = own[1].shape[1]
    assert torch.equal(scales[:, :num_chunks], own[1]) and torch.equal(cu_chunks, own[2])
    expected, cols = aligned_columns_reference(own[0], starts)
    assert cu_vt.tolist() == cols and all(c % vt_layout.SPAN_COLUMNS == 0 for c in cols)
    width = expected.shape[-1]
    assert torch.equal(v8t.view(torch.uint8)[..., :width], expected)
    assert not v8t.view(torch.uint8)[..., width:].any()


@pytest.mark.parametrize("recipe", ["current", "mxfp8"])
def test_thd_sequences_sit_at_aligned_v_columns(recipe):
    cu = torch.tensor([0, 5, 70, 70, 133, 200], dtype=torch.int32)
    v = torch.randn(200, 2, 64, generator=torch.Generator().manual_seed(0)).half()
    q = torch.zeros(200, 4, 64, dtype=torch.float16)
    seqs = sequences(q, v, "thd", "padding_causal", cu, cu, None, None, None)
    assert seqs.align_v
    _check_aligned(*_quantized_v(v, "thd", seqs, recipe), cu.tolist())


@pytest.mark.parametrize("qkv_format", ["bshd", "sbhd"])
def test_dense_samples_sit_at_aligned_v_columns(qkv_format):
    b, s = 3, 37
    shape = (b, s, 2, 64) if qkv_format == "bshd" else (s, b, 2, 64)
    v = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).half()
    seqs = sequences(v, v, qkv_format, "causal", None, None, None, None, None)
    assert seqs.align_v
    _check_aligned(*_quantized_v(v, qkv_format, seqs, "current"), [0, s, 2 * s, 3 * s])


def test_thd_aligned_starts_keep_the_plain_columns():
    """thd always takes the aligned layout (the launcher does not read the starts); where every
    start is on the 32-grid (vt_layout.SPAN_COLUMNS), each token stays in the plain layout's
    column."""
    cu = torch.tensor([0, 32, 32, 160, 173], dtype=torch.int32)  # only the end is off the grid
    v = torch.randn(173, 2, 64, generator=torch.Generator().manual_seed(2)).half()
    seqs = sequences(v, v, "thd", "padding_causal", cu, cu, None, None, None)
    assert seqs.align_v
    (v8t, _, _, cu_vt), own = _quantized_v(v, "thd", seqs, "current")
    width = own[0].shape[-1]
    assert torch.equal(v8t[..., :width].view(torch.uint8), own[0].view(torch.uint8))
    assert torch.equal(cu_vt[:-1], cu[:-1])


def test_mx_columnwise_sbhd_matches_reference():
    v = _x(40, 2, 2, 64)  # sbhd: 2 samples of 40 tokens, chunks of 32 + 8
    data_t, codes, cu_chunks = Q.per_chunk_cast_to_mxfp8_columnwise_transposed(v, qkv_format="sbhd")
    tokens = v.transpose(0, 1).flatten(0, 1)
    ref_data, ref_codes, ref_cu = ref.per_chunk_cast_to_mxfp8_columnwise(
        tokens, SeqLayout.dense(2, 40)
    )
    assert torch.equal(_bits(data_t[:, :, :80]), _bits(ref_data.permute(1, 2, 0)))
    assert torch.equal(codes, ref_codes.transpose(0, 1)) and cu_chunks.tolist() == ref_cu


def test_strided_views_equal_contiguous_copies():
    qkv = _x(2, 20, 3, 2, 64)  # bs3hd
    q = qkv[:, :, 0]
    for fn in (Q.per_token_cast_to_fp8, Q.per_chunk_cast_to_fp8_transposed):
        for got, expected in zip(fn(q, qkv_format="bshd"), fn(q.contiguous(), qkv_format="bshd")):
            assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))


def test_auto_backend_on_cpu_is_the_reference():
    x = _x(2, 8, 2, 128)
    auto = Q.per_token_cast_to_fp8(x, qkv_format="bshd")
    torch_path = Q.per_token_cast_to_fp8(x, qkv_format="bshd", backend="torch")
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(auto, torch_path))
    assert isinstance(Q.extension_available(), bool)


def test_empty_input():
    x = torch.zeros(2, 0, 2, 64, dtype=torch.bfloat16)
    data, scale_inv = Q.per_token_cast_to_fp8(x, qkv_format="bshd")
    assert data.shape == (2, 0, 64) and scale_inv.shape == (2, 0)
    data_t, scale_inv, cu = Q.per_chunk_cast_to_fp8_transposed(x, qkv_format="bshd")
    assert data_t.shape == (2, 64, 0) and scale_inv.shape == (2, 0) and cu.tolist() == [0, 0, 0]


BAD_INPUTS = [
    (
        "dtype",
        dict(x=torch.zeros(1, 4, 1, 64)),
        TypeError,
        "bfloat16 or float16, got torch.float32",
    ),
    ("not a tensor", dict(x=[1.0]), TypeError, "must be a torch.Tensor"),
    ("format", dict(qkv_format="bhsd"), ValueError, "qkv_format must be one of"),
    ("ndim", dict(x=torch.zeros(4, 1, 64, dtype=torch.bfloat16)), ValueError, "must have 4 dims"),
    (
        "head dim",
        dict(x=torch.zeros(1, 4, 1, 96, dtype=torch.bfloat16)),
        ValueError,
        "head dims \\(64, 128, 256\\), got 96",
    ),
    (
        "d stride",
        dict(x=torch.zeros(1, 4, 64, 2, dtype=torch.bfloat16).transpose(-1, -2)),
        ValueError,
        "head dim must be contiguous",
    ),
    ("backend", dict(backend="triton"), ValueError, "backend must be one of"),
    ("cuda backend on cpu", dict(backend="cuda"), ValueError, "backend='cuda' needs CUDA tensors"),
]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_per_token_errors(case):
    _, overrides, error, message = case
    kw = dict(x=torch.zeros(1, 4, 1, 64, dtype=torch.bfloat16), qkv_format="bshd")
    kw.update(overrides)
    with pytest.raises(error, match=message):
        Q.per_token_cast_to_fp8(kw.pop("x"), **kw)


def test_mx_head_dim_error():
    with pytest.raises(ValueError, match="multiple of 32"):
        Q.per_block_cast_to_mxfp8_rowwise(
            torch.zeros(1, 4, 1, 48, dtype=torch.bfloat16), qkv_format="bshd"
        )
    with pytest.raises(ValueError, match="at most 1024"):
        Q.per_chunk_cast_to_mxfp8_columnwise_transposed(
            torch.zeros(1, 4, 1, 1056, dtype=torch.bfloat16), qkv_format="bshd"
        )


def _cu(*offsets, dtype=torch.int32):
    return torch.tensor(offsets, dtype=dtype)


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize(
    "qkv_format,starts", [("thd", [0, 5, 70, 70, 133, 200]), ("bshd", [0, 37, 74, 111])]
)
def test_sm90_pv_key_order_permutes_each_complete_16_token_group(qkv_format, starts, aligned):
    """key_order="sm90_pv": inside each complete 16-token group of a sequence, column i holds
    the group's token SM90_PV_KEY_ORDER[i]; an incomplete last group, the scales and the chunks
    stay as in the natural order."""
    v = _x(starts[-1] + 9, 2, 64, dtype=torch.bfloat16, seed=6) * 100
    kw = dict(qkv_format="thd", cu_seqlens=torch.tensor(starts, dtype=torch.int32))
    if qkv_format == "bshd":
        v, kw = v[: starts[-1]].reshape(len(starts) - 1, starts[1], 2, 64), dict(qkv_format="bshd")
    kw["aligned_columns"] = aligned
    natural = Q.per_chunk_cast_to_fp8_transposed(v, **kw)
    permuted = Q.per_chunk_cast_to_fp8_transposed(v, key_order="sm90_pv", **kw)
    assert torch.equal(permuted[1], natural[1]) and torch.equal(permuted[2], natural[2])
    columns = vt_layout.aligned_column_starts_list(starts) if aligned else starts
    expected = natural[0].view(torch.uint8).clone()
    for n, (a, b) in enumerate(zip(starts, starts[1:])):
        span, c0 = b - a, columns[n]
        for g in range(span // 16):
            for i, j in enumerate(vt_layout.SM90_PV_KEY_ORDER):
                expected[..., c0 + 16 * g + i] = natural[0].view(torch.uint8)[..., c0 + 16 * g + j]
    assert torch.equal(permuted[0].view(torch.uint8), expected)
    assert sorted(vt_layout.SM90_PV_KEY_ORDER) == list(range(16))


def test_key_order_columns():
    assert vt_layout.key_order_columns(20, "natural").tolist() == list(range(20))
    order = vt_layout.key_order_columns(37, "sm90_pv").tolist()
    assert order[:16] == list(vt_layout.SM90_PV_KEY_ORDER)
    assert order[16:32] == [16 + j for j in vt_layout.SM90_PV_KEY_ORDER]
    assert order[32:] == [32, 33, 34, 35, 36]  # the incomplete group: natural order
    with pytest.raises(ValueError, match="key_order must be one of"):
        vt_layout.key_order_columns(4, "reversed")


BAD_V = [
    ("chunk", dict(chunk=48), ValueError, "chunk must be one of \\(16, 32, 64, 128\\)"),
    ("key order", dict(key_order="reversed"), ValueError, "key_order must be one of"),
    ("cu for bshd", dict(qkv_format="bshd", cu_seqlens=_cu(0, 8)), ValueError, "thd only"),
    ("thd without cu", dict(cu_seqlens=None), ValueError, "thd needs cu_seqlens"),
    ("cu dtype", dict(cu_seqlens=_cu(0, 8, dtype=torch.int64)), TypeError, "int32 tensor"),
    ("cu shape", dict(cu_seqlens=_cu(0)), ValueError, ">= 2 entries"),
    ("cu start", dict(cu_seqlens=_cu(1, 8)), ValueError, "start at 0"),
    ("cu decreasing", dict(cu_seqlens=_cu(0, 6, 4)), ValueError, "never decrease"),
    ("cu past t", dict(cu_seqlens=_cu(0, 9)), ValueError, "at most at t = 8"),
]


@pytest.mark.parametrize("case", BAD_V, ids=[c[0] for c in BAD_V])
def test_per_chunk_errors(case):
    _, overrides, error, message = case
    v = torch.zeros(8, 1, 64, dtype=torch.bfloat16)
    kw = dict(qkv_format="thd", cu_seqlens=_cu(0, 8))
    kw.update(overrides)
    if kw["qkv_format"] == "bshd":
        v = v.unsqueeze(0)
    with pytest.raises(error, match=message):
        Q.per_chunk_cast_to_fp8_transposed(v, **kw)


# sync_free: the thd V casts without reading cu_seqlens back (the attention launcher's thd path)


def _random_starts(gen, num_seqs, t):
    """[num_seqs + 1] sorted offsets in [0, t], first 0, with empty and unaligned sequences."""
    cuts = torch.randint(0, t + 1, (num_seqs - 1,), generator=gen).sort().values.tolist()
    return [0] + cuts + [int(torch.randint(cuts[-1] if cuts else 0, t + 1, (1,), generator=gen))]


@pytest.mark.parametrize("seed", range(12))
def test_sync_free_sizes_are_bounds_and_the_bytes_are_the_same(seed):
    """sync_free=True (thd): scales [h, chunk_bound] ([h, chunk_bound, d] for MXFP8) and, aligned, data_t of width
    aligned_width_bound; the host-offset outputs inside them, zeros in the added columns; the
    device-side cu_chunks equals the host one."""
    gen = torch.Generator().manual_seed(seed)
    t = int(torch.randint(1, 300, (1,), generator=gen))
    starts = _random_starts(gen, int(torch.randint(1, 7, (1,), generator=gen)), t)
    cu = torch.tensor(starts, dtype=torch.int32)
    v = _x(t, 2, 64, dtype=torch.float16, seed=seed)
    mx = seed % 2 == 1
    chunk = Q.MX_BLOCK if mx else [16, 32, 64, 128][seed % 4]
    if mx:
        cast = Q.per_chunk_cast_to_mxfp8_columnwise_transposed
    else:
        cast = functools.partial(Q.per_chunk_cast_to_fp8_transposed, chunk=chunk)
    for aligned in (False, True):
        kw = dict(qkv_format="thd", cu_seqlens=cu, aligned_columns=aligned)
        exact = cast(v, **kw)
        bound = cast(v, sync_free=True, **kw)
        num_seqs, num_chunks = len(starts) - 1, exact[1].shape[1]
        assert bound[1].shape[:2] == (2, Q.chunk_bound(t, num_seqs, chunk))
        assert bound[1].shape[2:] == ((64,) if mx else ())
        assert num_chunks <= bound[1].shape[1]
        assert torch.equal(bound[1][:, :num_chunks], exact[1]) and torch.equal(bound[2], exact[2])
        width = exact[0].shape[-1]
        if aligned:
            assert bound[0].shape[-1] == vt_layout.aligned_width_bound(t, num_seqs) >= width
        else:
            assert bound[0].shape == exact[0].shape
        assert torch.equal(bound[0][..., :width].view(torch.uint8), exact[0].view(torch.uint8))
        assert not bound[0][..., width:].view(torch.uint8).any()
    cu_chunks, columns = Q.sequence_offsets(cu, chunk)  # torch operations on the CPU
    assert cu_chunks.dtype == columns.dtype == torch.int32 and torch.equal(cu_chunks, exact[2])
    assert columns.tolist() == vt_layout.aligned_column_starts_list(starts)


def test_bounds_are_reached():
    """The bounds are the worst cases: 1-token sequences (chunks) and 1-token sequences each
    starting off the 32-grid (aligned width)."""
    assert Q.chunk_bound(5, 5, 128) == 5
    starts = list(range(6))
    assert vt_layout.aligned_column_starts_list(starts)[-1] == 5 * vt_layout.SPAN_COLUMNS == 160
    assert vt_layout.aligned_width_bound(5, 5) == 160


def test_sequence_offsets_rejects_other_offsets():
    with pytest.raises(ValueError, match="1-D int32"):
        Q.sequence_offsets(torch.tensor([0, 5, 9]), 128)  # int64
    with pytest.raises(ValueError, match="1-D int32"):
        Q.sequence_offsets(torch.zeros(1, dtype=torch.int32), 128)
    with pytest.raises(ValueError, match="chunk must be"):
        Q.sequence_offsets(torch.tensor([0, 5], dtype=torch.int32), 48)


def test_current_v_scale_is_one_per_chunk_and_kv_head():
    """Rules v2: an outlier in one channel re-scales every channel of its (chunk, kv-head), and
    nothing in the other chunks or kv-heads (Note [Mask-exact FP8 scaling])."""
    v = _x(1, 256, 2, 64)
    v2 = v.clone()
    v2[0, 130, 1, 7] = 1e4  # chunk 1 of 128 tokens, kv-head 1, channel 7
    base_t, base_s, _ = Q.per_chunk_cast_to_fp8_transposed(v, qkv_format="bshd")
    pert_t, pert_s, _ = Q.per_chunk_cast_to_fp8_transposed(v2, qkv_format="bshd")
    assert base_s.shape == (2, 2)  # [h_kv, num_chunks]
    changed = base_s != pert_s
    assert changed.tolist() == [[False, False], [False, True]]
    assert pert_s[1, 1] == 1.0 / compute_scale_from_amax(torch.tensor(1e4).bfloat16())
    same = _bits(base_t) == _bits(pert_t)  # [h, d, t]
    assert same[0].all() and same[1, :, :128].all()
    assert not same[1, 0, 128:].all()  # channel 0 of chunk 1 re-rounded by the new scale
