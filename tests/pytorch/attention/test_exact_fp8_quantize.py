"""GPU tests of the mask-exact FP8 quantization kernels (transformer_engine_exact_fp8).

Every kernel output is compared bitwise (torch.equal on the raw bits) with the pure-torch
reference of reference/quantize.py, reached through the same API with backend="torch". One test
per cast also pins the API's layout against the reference functions directly.
"""

import pytest
import torch

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import quantize as Q
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference import (
    quantize as ref,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.formats import (
    MX_BLOCK,
    V_CHUNK_CURRENT,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import (
    SeqLayout,
    to_tokens,
)

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        not Q.extension_available(), reason="transformer_engine_exact_fp8 is not built"
    ),
]

DTYPES = (torch.bfloat16, torch.float16)
HEAD_DIMS = (64, 128, 256)
FORMATS = ("bshd", "sbhd", "thd")
CU_SEQLENS = (0, 5, 70, 70, 133, 200)  # an empty sequence, unaligned starts, short last chunks
THD_TOKENS = 216  # tokens 200..215 belong to no sequence
_BITS = {
    torch.float8_e4m3fn: torch.uint8,
    torch.uint8: torch.uint8,
    torch.float32: torch.int32,
    torch.int32: torch.int32,
}


def assert_bitwise(out: torch.Tensor, expected: torch.Tensor) -> None:
    assert out.shape == expected.shape and out.dtype == expected.dtype
    assert out.device == expected.device
    bits = _BITS[out.dtype]
    assert torch.equal(out.view(bits), expected.view(bits))


def assert_same_results(cuda_results, torch_results) -> None:
    for out, expected in zip(cuda_results, torch_results, strict=True):
        assert_bitwise(out, expected)


@pytest.fixture(autouse=True)
def dirty_allocator():
    """Leave 0xA5 bytes in the caching allocator, so an output element the kernel forgets to
    write shows up as a mismatch rather than as a lucky zero (blocks of the small pool, which
    serves requests below 1 MiB from 2 MiB segments, and of the large pool)."""
    sizes = (1 << 12, 1 << 16, 1 << 18, 1 << 19, (1 << 20) - 512, 1 << 22)
    junk = [torch.full((n,), 0xA5, dtype=torch.uint8, device="cuda") for n in sizes]
    del junk
    yield


def _random(shape, dtype, gen, specials=True) -> torch.Tensor:
    """Normal values with magnitudes spread over many decades per token and per channel, plus
    zeros, subnormals and values near the dtype's max at random places."""
    spread = 4.0 if dtype == torch.bfloat16 else 2.5  # fp16 overflows past 65504
    decades = torch.empty(*shape[:-1], 1).uniform_(-spread, spread, generator=gen)
    channel = torch.empty(shape[-1]).uniform_(-1, 1, generator=gen)
    x = torch.randn(shape, generator=gen) * torch.pow(10.0, decades + channel)
    if specials:
        info = torch.finfo(dtype)
        picks = torch.rand(shape, generator=gen)
        x = torch.where(picks < 0.02, torch.zeros_like(x), x)
        x = torch.where((picks > 0.02) & (picks < 0.04), x.sign() * info.smallest_normal / 4, x)
        x = torch.where((picks > 0.04) & (picks < 0.05), x.sign() * info.max * 0.9, x)
    return x.to(dtype)


def _make(qkv_format, dtype, d, gen, batch=2, seqlen=150, heads=3):
    """(x on the GPU in qkv_format, cu_seqlens or None); one (token, head) row is all zeros."""
    if qkv_format == "thd":
        x = _random((THD_TOKENS, heads, d), dtype, gen)
        x[7, 1] = 0
        cu = torch.tensor(CU_SEQLENS, dtype=torch.int32, device="cuda")
        return x.cuda(), cu
    x = _random((batch, seqlen, heads, d), dtype, gen)
    x[1, 3, 2] = 0
    if qkv_format == "sbhd":
        x = x.transpose(0, 1).contiguous()
    return x.cuda(), None


def _both(fn, x, **kw):
    return fn(x, backend="cuda", **kw), fn(x, backend="torch", **kw)


# ---------------------------------------------------------------------------------------------
# Q and K: per token (current scaling) and per 32 channels (MXFP8)


@pytest.mark.parametrize("qkv_format", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("pow2,eps", [(False, 0.0), (True, 0.0), (False, 1.0), (True, 1e-3)])
def test_per_token_matches_reference(qkv_format, dtype, d, pow2, eps):
    x, _ = _make(qkv_format, dtype, d, torch.Generator().manual_seed(d))
    kw = dict(qkv_format=qkv_format, use_power_2_scales=pow2, amax_epsilon=eps)
    assert_same_results(*_both(Q.per_token_cast_to_fp8, x, **kw))


@pytest.mark.parametrize("qkv_format", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", (32, 64, 96, 128, 256, 1024))
def test_mxfp8_rowwise_matches_reference(qkv_format, dtype, d):
    x, _ = _make(qkv_format, dtype, d, torch.Generator().manual_seed(d + 1))
    assert_same_results(*_both(Q.per_block_cast_to_mxfp8_rowwise, x, qkv_format=qkv_format))


@pytest.mark.parametrize("qkv_format", FORMATS)
def test_rowwise_layout_matches_reference_functions(qkv_format):
    x, _ = _make(qkv_format, torch.bfloat16, 128, torch.Generator().manual_seed(3))
    tokens = to_tokens(x.cpu(), qkv_format)  # [t, h, d]
    data, scale_inv = Q.per_token_cast_to_fp8(x, qkv_format=qkv_format, backend="cuda")
    ref_data, ref_scale_inv = ref.per_token_cast_to_fp8(tokens)
    assert_bitwise(data.cpu(), ref_data.transpose(0, 1).contiguous())
    assert_bitwise(scale_inv.cpu(), ref_scale_inv.t().contiguous())
    data, codes = Q.per_block_cast_to_mxfp8_rowwise(x, qkv_format=qkv_format, backend="cuda")
    ref_data, ref_codes = ref.per_block_cast_to_mxfp8_rowwise(tokens)
    assert_bitwise(data.cpu(), ref_data.transpose(0, 1).contiguous())
    assert_bitwise(codes.cpu(), ref_codes.transpose(0, 1).contiguous())


# ---------------------------------------------------------------------------------------------
# V: current scaling one scale per (chunk, kv-head), MXFP8 per (32-token chunk, channel); transposed


@pytest.mark.parametrize("qkv_format", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("chunk", Q.CHUNK_SIZES)
@pytest.mark.parametrize("aligned", [False, True])
def test_per_chunk_matches_reference(qkv_format, dtype, d, chunk, aligned):
    """aligned: vt_layout's aligned layout (CU_SEQLENS and seqlen 150 start off the 16-grid)."""
    v, cu = _make(qkv_format, dtype, d, torch.Generator().manual_seed(chunk + d))
    kw = dict(qkv_format=qkv_format, cu_seqlens=cu, chunk=chunk, aligned_columns=aligned)
    assert_same_results(*_both(Q.per_chunk_cast_to_fp8_transposed, v, **kw))


@pytest.mark.parametrize("qkv_format", FORMATS)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("aligned", [False, True])
def test_per_chunk_sm90_pv_key_order_matches_reference(qkv_format, d, aligned):
    """key_order="sm90_pv" (the sm90 kernel's V8^T): CUDA == reference byte for byte, the
    sequences' incomplete 16-token groups included (CU_SEQLENS and seqlen 150)."""
    v, cu = _make(qkv_format, torch.bfloat16, d, torch.Generator().manual_seed(d + 7))
    kw = dict(qkv_format=qkv_format, cu_seqlens=cu, aligned_columns=aligned, key_order="sm90_pv")
    assert_same_results(*_both(Q.per_chunk_cast_to_fp8_transposed, v, **kw))


@pytest.mark.parametrize("qkv_format", FORMATS)
@pytest.mark.parametrize("pow2,eps", [(True, 0.0), (False, 1.0), (True, 1e-3)])
def test_per_chunk_scale_options(qkv_format, pow2, eps):
    v, cu = _make(qkv_format, torch.bfloat16, 128, torch.Generator().manual_seed(5))
    kw = dict(qkv_format=qkv_format, cu_seqlens=cu, use_power_2_scales=pow2, amax_epsilon=eps)
    assert_same_results(*_both(Q.per_chunk_cast_to_fp8_transposed, v, **kw))


@pytest.mark.parametrize("qkv_format", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", (32, 64, 96, 128, 256, 1024))
@pytest.mark.parametrize("aligned", [False, True])
def test_mxfp8_columnwise_matches_reference(qkv_format, dtype, d, aligned):
    v, cu = _make(qkv_format, dtype, d, torch.Generator().manual_seed(d + 7))
    kw = dict(qkv_format=qkv_format, cu_seqlens=cu, aligned_columns=aligned)
    assert_same_results(*_both(Q.per_chunk_cast_to_mxfp8_columnwise_transposed, v, **kw))


@pytest.mark.parametrize("qkv_format", FORMATS)
def test_transposed_layout_matches_reference_functions(qkv_format):
    v, cu = _make(qkv_format, torch.float16, 64, torch.Generator().manual_seed(9))
    tokens = to_tokens(v.cpu(), qkv_format)  # [t, h, d]
    if qkv_format == "thd":
        layout = SeqLayout.varlen(cu.cpu())
    else:
        b_dim, s_dim = (0, 1) if qkv_format == "bshd" else (1, 0)
        layout = SeqLayout.dense(v.shape[b_dim], v.shape[s_dim])
    real = tokens[: layout.total]
    data_t, scale_inv, cu_chunks = Q.per_chunk_cast_to_fp8_transposed(
        v, qkv_format=qkv_format, cu_seqlens=cu, backend="cuda"
    )
    ref_data, ref_scale_inv, ref_cu_chunks = ref.per_chunk_cast_to_fp8(real, layout)
    assert_bitwise(data_t.cpu()[:, :, : layout.total], ref_data.permute(1, 2, 0).contiguous())
    assert not data_t.cpu()[:, :, layout.total :].view(torch.uint8).any()  # padding is zero
    assert scale_inv.shape == (tokens.shape[1], len(ref_scale_inv))  # [h_kv, num_chunks]
    assert_bitwise(scale_inv.cpu(), ref_scale_inv.transpose(0, 1).contiguous())
    assert cu_chunks.tolist() == ref_cu_chunks


def _large(case):
    """(v, qkv_format, cu_seqlens) with far more blocks than the GPU holds at once; in thd, 60
    sequences of random lengths, so warp tiles cover the ends of many sequences and short chunks."""
    gen = torch.Generator().manual_seed(31)
    if case == "bshd":
        return _random((2, 8192, 16, 128), torch.bfloat16, gen).cuda(), "bshd", None
    if case == "thd":
        lens = torch.randint(1, 800, (60,), generator=gen)
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32)
        v = _random((int(cu[-1]) + 5, 8, 128), torch.float16, gen)  # 5 unowned tokens
        return v.cuda(), "thd", cu.cuda()
    # sbhd with head stride 130: element loads
    return _random((8192, 2, 16, 130), torch.bfloat16, gen).cuda()[..., :128], "sbhd", None


@pytest.mark.parametrize("case", ["bshd", "thd", "element_loads"])
def test_large_inputs_match_reference(case):
    v, qkv_format, cu = _large(case)
    for aligned in (False, True):
        kw = dict(qkv_format=qkv_format, cu_seqlens=cu, aligned_columns=aligned)
        assert_same_results(*_both(Q.per_chunk_cast_to_fp8_transposed, v, **kw))
        assert_same_results(*_both(Q.per_chunk_cast_to_mxfp8_columnwise_transposed, v, **kw))
    assert_same_results(*_both(Q.per_token_cast_to_fp8, v, qkv_format=qkv_format))


@pytest.mark.parametrize("no_l1", ["0", "1"])
@pytest.mark.parametrize("case", ["small", "bshd", "thd", "element_loads"])
def test_per_chunk_load_policy_matches_reference(case, no_l1, monkeypatch):
    """The current-scaling V cast's loads with and without L1 allocation (chosen by the grid's
    size, forced here through NVTE_EXACT_FP8_V_CAST_NO_L1) give the reference's bits, small grids
    and large ones, aligned columns or not."""
    monkeypatch.setenv("NVTE_EXACT_FP8_V_CAST_NO_L1", no_l1)
    if case == "small":
        inputs = [
            (*_make(f, dtype, 128, torch.Generator().manual_seed(5)), f)
            for f in FORMATS
            for dtype in DTYPES
        ]
    else:
        v, qkv_format, cu = _large(case)
        inputs = [(v, cu, qkv_format)]
    for v, cu, qkv_format in inputs:
        for aligned in (False, True):
            kw = dict(qkv_format=qkv_format, cu_seqlens=cu, aligned_columns=aligned)
            assert_same_results(*_both(Q.per_chunk_cast_to_fp8_transposed, v, **kw))


@pytest.mark.parametrize("num_seqs", [1, 3, 255, 256, 257, 5000])
@pytest.mark.parametrize("chunk", Q.CHUNK_SIZES)
def test_sequence_offsets_kernel_matches_torch(num_seqs, chunk):
    """The offsets kernel (one block, 256 sequences per scan round, a carry between rounds)
    against the torch formulas: random lengths, a fifth of the sequences empty."""
    gen = torch.Generator().manual_seed(num_seqs * 7 + chunk)
    lens = torch.randint(0, 300, (num_seqs,), generator=gen)
    lens *= torch.rand(num_seqs, generator=gen) > 0.2
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).int().cuda()
    got = Q.sequence_offsets(cu, chunk, backend="cuda")
    want = Q.sequence_offsets(cu, chunk, backend="torch")
    assert_bitwise(got[0], want[0])
    assert_bitwise(got[1], want[1])
    cu_chunks, no_columns = Q.sequence_offsets(cu, chunk, aligned_columns=False, backend="cuda")
    assert no_columns is None
    assert_bitwise(cu_chunks, want[0])


def _v_cast(mx):
    if mx:
        return Q.per_chunk_cast_to_mxfp8_columnwise_transposed
    return Q.per_chunk_cast_to_fp8_transposed


def _assert_same_inside_bounds(got, want):
    """sync_free outputs: data_t and cu_chunks whole, the scales up to the real chunk count (the
    bound's extra rows are unspecified: the kernel leaves them unwritten)."""
    num_chunks = int(want[2][-1])
    assert_bitwise(got[0], want[0])
    assert_bitwise(got[1][:, :num_chunks], want[1][:, :num_chunks])
    assert_bitwise(got[2], want[2])


@pytest.mark.parametrize("mx", [False, True], ids=["current", "mxfp8"])
@pytest.mark.parametrize("aligned", [False, True])
def test_sync_free_matches_reference_inside_the_bounds(mx, aligned):
    """sync_free=True (thd, the attention launcher's path): the kernel reads the chunk count from
    the device; 60 random sequences, and CU_SEQLENS (an empty sequence, unaligned starts)."""
    for v, cu in (_large("thd")[::2], _make("thd", torch.float16, 64, torch.Generator())):
        kw = dict(qkv_format="thd", cu_seqlens=cu, aligned_columns=aligned, sync_free=True)
        got, want = _both(_v_cast(mx), v, **kw)
        assert got[1].shape[1] == Q.chunk_bound(v.shape[0], cu.numel() - 1, MX_BLOCK if mx else 128)
        _assert_same_inside_bounds(got, want)


@pytest.mark.parametrize("mx", [False, True], ids=["current", "mxfp8"])
def test_sync_free_cast_replays_with_other_offsets(mx):
    """Captured in a CUDA graph (so no host read), a sync_free V cast replayed on other
    cu_seqlens contents gives the eager cast of those offsets."""
    gen = torch.Generator().manual_seed(8)
    v = _random((400, 2, 128), torch.bfloat16, gen).cuda()
    packs = [[0, 130, 131, 300], [0, 5, 205, 400], [0, 0, 77, 77]]
    cu = torch.tensor(packs[0], dtype=torch.int32, device="cuda")
    kw = dict(qkv_format="thd", cu_seqlens=cu, aligned_columns=True, sync_free=True)
    _v_cast(mx)(v, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _v_cast(mx)(v, **kw)
    for pack in packs[1:] + packs[:1]:
        cu.copy_(torch.tensor(pack, dtype=torch.int32))
        graph.replay()
        _assert_same_inside_bounds(captured, _v_cast(mx)(v, backend="torch", **kw))


# ---------------------------------------------------------------------------------------------
# Strided views of TE's packed layouts, unaligned views, GQA


def _packed_view(name, dtype, gen, b=2, s=70, h=3, d=128):
    """(view, qkv_format, cu_seqlens) of one tensor of a packed QKV / KV layout."""
    shapes = {
        "bs3hd": ((b, s, 3, h, d), "bshd", lambda t: t[:, :, 0]),
        "sb3hd": ((s, b, 3, h, d), "sbhd", lambda t: t[:, :, 1]),
        "bsh3d": ((b, s, h, 3, d), "bshd", lambda t: t[:, :, :, 2]),
        "sbh3d": ((s, b, h, 3, d), "sbhd", lambda t: t[:, :, :, 0]),
        "bshd_bs2hd": ((b, s, 2, h, d), "bshd", lambda t: t[:, :, 1]),
        "sbhd_sb2hd": ((s, b, 2, h, d), "sbhd", lambda t: t[:, :, 1]),
        "bshd_bsh2d": ((b, s, h, 2, d), "bshd", lambda t: t[:, :, :, 1]),
        "sbhd_sbh2d": ((s, b, h, 2, d), "sbhd", lambda t: t[:, :, :, 1]),
        "t3hd": ((b * s, 3, h, d), "thd", lambda t: t[:, 2]),
        "th3d": ((b * s, h, 3, d), "thd", lambda t: t[:, :, 1]),
        "thd_t2hd": ((b * s, 2, h, d), "thd", lambda t: t[:, 1]),
        # 2-byte offset: not 16-byte aligned, so the element-load path runs
        "bshd_unaligned": ((b, s, h, d + 8), "bshd", lambda t: t[..., 1 : d + 1]),
        # head stride d + 2: no stride is a multiple of 8 elements
        "sbhd_odd_stride": ((s, b, h, d + 2), "sbhd", lambda t: t[..., :d]),
    }
    shape, qkv_format, select = shapes[name]
    view = select(_random(shape, dtype, gen).cuda())
    cu = torch.tensor([0, 33, 100, b * s], dtype=torch.int32, device="cuda")
    return view, qkv_format, cu if qkv_format == "thd" else None


PACKED = (
    "bs3hd",
    "sb3hd",
    "bsh3d",
    "sbh3d",
    "bshd_bs2hd",
    "sbhd_sb2hd",
    "bshd_bsh2d",
    "sbhd_sbh2d",
    "t3hd",
    "th3d",
    "thd_t2hd",
    "bshd_unaligned",
    "sbhd_odd_stride",
)


@pytest.mark.parametrize("name", PACKED)
@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_views(name, dtype):
    x, qkv_format, cu = _packed_view(name, dtype, torch.Generator().manual_seed(11))
    assert not x.is_contiguous()
    assert_same_results(*_both(Q.per_token_cast_to_fp8, x, qkv_format=qkv_format))
    assert_same_results(*_both(Q.per_block_cast_to_mxfp8_rowwise, x, qkv_format=qkv_format))
    kw = dict(qkv_format=qkv_format, cu_seqlens=cu)
    assert_same_results(*_both(Q.per_chunk_cast_to_fp8_transposed, x, **kw))
    assert_same_results(*_both(Q.per_chunk_cast_to_mxfp8_columnwise_transposed, x, **kw))
    # the view gives the same bits as a contiguous copy
    contiguous = Q.per_token_cast_to_fp8(x.contiguous(), qkv_format=qkv_format, backend="cuda")
    assert_same_results(Q.per_token_cast_to_fp8(x, qkv_format=qkv_format), contiguous)


def test_gqa_heads_are_independent():
    """K and V of GQA (h_kv < h) quantize per kv-head; Q per query head; shapes follow."""
    gen = torch.Generator().manual_seed(13)
    q = _random((2, 96, 8, 128), torch.bfloat16, gen).cuda()
    kv = _random((2, 96, 2, 2, 128), torch.bfloat16, gen).cuda()
    k, v = kv[:, :, 0], kv[:, :, 1]
    q_data, q_scale = Q.per_token_cast_to_fp8(q, qkv_format="bshd")
    k_data, k_scale = Q.per_token_cast_to_fp8(k, qkv_format="bshd")
    v_data, v_scale, _ = Q.per_chunk_cast_to_fp8_transposed(v, qkv_format="bshd", chunk=64)
    assert q_data.shape == (8, 192, 128) and q_scale.shape == (8, 192)
    assert k_data.shape == (2, 192, 128) and k_scale.shape == (2, 192)
    assert v_data.shape == (2, 128, 192) and v_scale.shape == (2, 4)  # 2 chunks per sample
    single = Q.per_token_cast_to_fp8(k[:, :, 1:].contiguous(), qkv_format="bshd")
    assert_same_results((k_data[1:], k_scale[1:]), single)


# ---------------------------------------------------------------------------------------------
# NaN and Inf: documented behaviour (docs/quantization_kernels.md)


def _with_specials(dtype, nan: bool):
    """[1, 64, 1, 64] bshd: NaN of both signs at tokens 3 and 4 (with nan), +-inf at 40 and 41."""
    v = _random((1, 64, 1, 64), dtype, torch.Generator().manual_seed(17), specials=False)
    if nan:
        v[0, 3, 0, 5] = float("nan")
        # -NaN by its bits: a float -> bfloat16 conversion would make it +NaN
        v.view(torch.int16)[0, 4, 0, 5] = -0x40 if dtype == torch.bfloat16 else -0x200
    v[0, 40, 0, 9] = float("inf")
    v[0, 41, 0, 10] = -float("inf")
    return v.cuda()


def _nan_unsigned(data: torch.Tensor) -> torch.Tensor:
    """E4M3 bits with the sign of NaN (0x7F / 0xFF) cleared: torch's own fp16 -> fp32 conversion
    keeps or drops the sign of a NaN depending on its code path, so the sign is not compared."""
    raw = data.view(torch.uint8)
    return torch.where(raw & 0x7F == 0x7F, torch.full_like(raw, 0x7F), raw)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_is_kept_and_decides_no_scale(dtype):
    v = _with_specials(dtype, nan=True)
    data, scale_inv = Q.per_token_cast_to_fp8(v, qkv_format="bshd")
    ref_data, ref_scale_inv = Q.per_token_cast_to_fp8(v, qkv_format="bshd", backend="torch")
    assert torch.equal(_nan_unsigned(data), _nan_unsigned(ref_data))
    assert_bitwise(scale_inv, ref_scale_inv)
    raw = data.view(torch.uint8)
    assert raw[0, 3, 5] == 0x7F and raw[0, 4, 5] & 0x7F == 0x7F  # NaN stays NaN
    if dtype == torch.bfloat16:
        assert raw[0, 4, 5] == 0xFF  # and keeps its sign
    without_nan = v.clone()
    without_nan[0, 3, 0, 5] = 0
    _, clean_scale_inv = Q.per_token_cast_to_fp8(without_nan, qkv_format="bshd")
    assert torch.equal(scale_inv[0, 3], clean_scale_inv[0, 3])  # NaN ignored by the amax
    for fn in (
        Q.per_chunk_cast_to_fp8_transposed,
        Q.per_chunk_cast_to_mxfp8_columnwise_transposed,
    ):
        (data_t, scales, _), (ref_data_t, ref_scales, _) = _both(fn, v, qkv_format="bshd")
        assert torch.equal(_nan_unsigned(data_t), _nan_unsigned(ref_data_t))
        assert_bitwise(scales, ref_scales)
        assert data_t.view(torch.uint8)[0, 5, 3] == 0x7F
    assert scales[0, 0, 5] < 254  # the NaNs' (chunk, channel) gets a finite E8M0 code


@pytest.mark.parametrize("dtype", DTYPES)
def test_inf_saturates_and_makes_scale_one(dtype):
    v = _with_specials(dtype, nan=False)
    data, scale_inv = Q.per_token_cast_to_fp8(v, qkv_format="bshd")
    assert scale_inv[0, 40] == 1.0 and data.view(torch.uint8)[0, 40, 9] == 0x7E  # +448
    assert scale_inv[0, 41] == 1.0 and data.view(torch.uint8)[0, 41, 10] == 0xFE  # -448
    _, codes = Q.per_block_cast_to_mxfp8_rowwise(v, qkv_format="bshd")
    assert codes[0, 40, 0] == 254
    for fn in (
        Q.per_token_cast_to_fp8,
        Q.per_block_cast_to_mxfp8_rowwise,
        Q.per_chunk_cast_to_fp8_transposed,
        Q.per_chunk_cast_to_mxfp8_columnwise_transposed,
    ):
        assert_same_results(*_both(fn, v, qkv_format="bshd"))


# ---------------------------------------------------------------------------------------------
# Mask-exactness of the scales: a token changes nothing outside its own scale's group


@pytest.mark.parametrize("mx", [False, True])
def test_future_chunk_changes_no_earlier_bits(mx):
    """An outlier at token 100 of sample 0 changes only chunk 100 // C of sample 0 (bitwise), C
    the default chunk (V_CHUNK_CURRENT, or MX_BLOCK for MXFP8); 300-token samples hold several."""
    fn = (
        Q.per_chunk_cast_to_mxfp8_columnwise_transposed
        if mx
        else Q.per_chunk_cast_to_fp8_transposed
    )
    chunk = MX_BLOCK if mx else V_CHUNK_CURRENT
    v, _ = _make("bshd", torch.bfloat16, 128, torch.Generator().manual_seed(19), seqlen=300)
    perturbed = v.clone()
    perturbed[0, 100] = torch.finfo(torch.bfloat16).max  # above every value _random draws
    base_data, base_scales, _ = fn(v, qkv_format="bshd")
    new_data, new_scales, _ = fn(perturbed, qkv_format="bshd")
    start, end = 100 // chunk * chunk, (100 // chunk + 1) * chunk
    keep = torch.ones(base_data.shape[-1], dtype=torch.bool, device="cuda")
    keep[start:end] = False
    assert torch.equal(
        base_data.view(torch.uint8)[..., keep], new_data.view(torch.uint8)[..., keep]
    )
    changed_chunk = 100 // chunk
    others = [c for c in range(base_scales.shape[1]) if c != changed_chunk]
    assert torch.equal(base_scales[:, others], new_scales[:, others])
    assert not torch.equal(base_scales[:, changed_chunk], new_scales[:, changed_chunk])


def test_one_token_changes_no_other_token():
    x, _ = _make("sbhd", torch.float16, 64, torch.Generator().manual_seed(23))
    perturbed = x.clone()
    perturbed[10, 1] = 6e4
    base = Q.per_token_cast_to_fp8(x, qkv_format="sbhd")
    new = Q.per_token_cast_to_fp8(perturbed, qkv_format="sbhd")
    token = 1 * x.shape[0] + 10  # (b, s) order
    keep = torch.ones(base[1].shape[1], dtype=torch.bool, device="cuda")
    keep[token] = False
    assert torch.equal(base[0].view(torch.uint8)[:, keep], new[0].view(torch.uint8)[:, keep])
    assert torch.equal(base[1][:, keep], new[1][:, keep])


# ---------------------------------------------------------------------------------------------
# Edge shapes and the stream


def test_empty_and_single_token_inputs():
    for seqlen in (0, 1):
        x = torch.randn(2, seqlen, 2, 64, device="cuda", dtype=torch.bfloat16)
        assert_same_results(*_both(Q.per_token_cast_to_fp8, x, qkv_format="bshd"))
        assert_same_results(*_both(Q.per_chunk_cast_to_fp8_transposed, x, qkv_format="bshd"))


def test_runs_on_the_current_stream():
    x, _ = _make("bshd", torch.bfloat16, 128, torch.Generator().manual_seed(29))
    expected = Q.per_token_cast_to_fp8(x, qkv_format="bshd")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = Q.per_token_cast_to_fp8(x, qkv_format="bshd")
    torch.cuda.current_stream().wait_stream(stream)
    assert_same_results(got, expected)


# ---------------------------------------------------------------------------------------------
# Errors: clear messages naming the problem


def test_bad_inputs_raise_clear_errors():
    x = torch.randn(2, 16, 2, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        Q.per_token_cast_to_fp8(x.float(), qkv_format="bshd")
    with pytest.raises(ValueError, match="head dims"):
        Q.per_token_cast_to_fp8(x[..., :96], qkv_format="bshd")
    with pytest.raises(ValueError, match="multiple of 32"):
        Q.per_block_cast_to_mxfp8_rowwise(x[..., :72], qkv_format="bshd")
    with pytest.raises(ValueError, match="qkv_format"):
        Q.per_token_cast_to_fp8(x, qkv_format="bhsd")
    with pytest.raises(ValueError, match="4 dims"):
        Q.per_token_cast_to_fp8(x[0], qkv_format="sbhd")
    d_strided = torch.randn(2, 16, 128, 2, device="cuda", dtype=torch.bfloat16).transpose(-1, -2)
    with pytest.raises(ValueError, match="contiguous"):
        Q.per_token_cast_to_fp8(d_strided, qkv_format="bshd")
    v = x[0]
    cu_cpu = torch.tensor([0, 16], dtype=torch.int32)
    with pytest.raises(ValueError, match="one device"):
        Q.per_chunk_cast_to_fp8_transposed(v, qkv_format="thd", cu_seqlens=cu_cpu)
    with pytest.raises(TypeError, match="int32"):
        Q.per_chunk_cast_to_fp8_transposed(v, qkv_format="thd", cu_seqlens=cu_cpu.long().cuda())
    with pytest.raises(ValueError, match="backend='cuda' needs CUDA"):
        Q.per_token_cast_to_fp8(x.cpu(), qkv_format="bshd", backend="cuda")


def test_c_api_errors_become_python_exceptions():
    """The C API validates on its own; its message reaches Python as a ValueError."""
    import transformer_engine_exact_fp8 as ext

    x = torch.randn(1, 4, 1, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(1, 4, 128, dtype=torch.uint8, device="cuda")
    scale = torch.empty(1, 4, device="cuda")
    view = ext.TokenView(
        data=x.data_ptr(), dtype=ext.BFLOAT16, batch=1, seqlen=4, heads=1, head_dim=96,
        stride_batch=512, stride_seq=128, stride_head=128,
    )  # fmt: skip
    with pytest.raises(
        ValueError, match="nvte_exact_fp8_per_token_cast: .*head_dim 64, 128 or 256"
    ):
        ext.per_token_cast(view, False, 0.0, out.data_ptr(), scale.data_ptr(), 0)
    view = ext.TokenView(
        data=x.data_ptr(), dtype=ext.BFLOAT16, batch=1, seqlen=4, heads=1, head_dim=128,
        stride_batch=512, stride_seq=128, stride_head=128,
    )  # fmt: skip
    with pytest.raises(ValueError, match="16-byte aligned"):
        ext.per_token_cast(view, False, 0.0, out.data_ptr() + 1, scale.data_ptr(), 0)
    chunks = ext.Chunks(cu_seqlens=0, cu_chunks=0, num_seqs=1, num_chunks=3, chunk=64)
    with pytest.raises(ValueError, match="num_chunks 1"):
        ext.per_chunk_cast_transposed(
            view, chunks, False, 0.0, out.data_ptr(), 16, scale.data_ptr(), 0
        )
    chunks = ext.Chunks(cu_seqlens=0, cu_chunks=0, num_seqs=1, num_chunks=1, chunk=64,
                        key_order=7)  # fmt: skip
    with pytest.raises(ValueError, match="key_order must be NVTE_EXACT_FP8_KEYS_NATURAL"):
        ext.per_chunk_cast_transposed(
            view, chunks, False, 0.0, out.data_ptr(), 16, scale.data_ptr(), 0
        )
    chunks = ext.Chunks(cu_seqlens=0, cu_chunks=0, num_seqs=1, num_chunks=1, chunk=32,
                        key_order=ext.KEYS_SM90_PV)  # fmt: skip
    with pytest.raises(
        ValueError, match="MXFP8 transposed cast writes NVTE_EXACT_FP8_KEYS_NATURAL"
    ):
        ext.per_chunk_cast_mxfp8_columnwise_transposed(
            view, chunks, out.data_ptr(), 16, scale.data_ptr(), 0
        )
    cu = torch.zeros(3, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="nvte_exact_fp8_sequence_offsets: chunk must be"):
        ext.sequence_offsets(cu.data_ptr(), 2, 48, cu.data_ptr(), 0, 0)
    with pytest.raises(ValueError, match="num_seqs must be"):
        ext.sequence_offsets(cu.data_ptr(), 0, 32, cu.data_ptr(), 0, 0)
