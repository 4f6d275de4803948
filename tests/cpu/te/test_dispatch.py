"""TE integration of mask-exact FP8 attention, the parts that run without TE's core library:
the dispatch decision table, the recipe functions (against the patched upstream recipe classes),
the backward's inputs (cuDNN softmax-stats layouts, dequantized Q/K) and the recompute backward.

The GPU side (DotProductAttention, MultiheadAttention, TransformerLayer with upstream TE) is
tests/pytorch/attention/test_exact_fp8_te.py.
"""

import dataclasses
import importlib.util
import logging
import math
import py_compile
import sys

import pytest
import torch

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import kernels
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.te import (
    backend,
    selection,
    status,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.te.autograd import (
    AttentionCall,
    lse_to_softmax_stats,
    recompute_backward,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.te.backend import (
    check_request,
    qkv_formats,
    unsupported_reason,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import (
    SeqLayout,
    allowed_positions,
    sequence_masks,
    to_tokens,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.quantize import (
    fp8_roundtrip,
    dequantize,
    dequantize_mxfp8_rowwise,
    per_block_cast_to_mxfp8_rowwise,
    per_token_cast_to_fp8,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.attention import (
    QuantConfig,
    reference_attention,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.te.recipe import (
    carry_mask_exact,
    dpa_runs_mask_exact,
    kernel_recipe,
    mask_exact_recipe,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
    rel_frobenius_error,
)

HEAD_DIMS = (64, 128)


# ---------------------------------------------------------------------------------------------
# The decision table


@dataclasses.dataclass
class Params:
    """The AttentionParams fields the dispatch reads (upstream's dataclass needs TE's core lib)."""

    qkv_type: type = torch.Tensor
    qkv_dtype: torch.dtype = torch.bfloat16
    qkv_layout: str = "bshd_bshd_bshd"
    head_dim_qk: int = 128
    head_dim_v: int = 128
    attn_mask_type: str = "causal"
    window_size: tuple = (-1, 0)
    bottom_right_diagonal: bool = False
    softcap: float = 0.0
    core_attention_bias_type: str = "no_bias"
    attention_dropout: float = 0.0
    context_parallel: bool = False
    is_training: bool = True
    inference_params: object = None
    softmax_type: str = "vanilla"
    return_max_logit: bool = False
    cuda_graph: bool = False
    has_score_mod: bool = False
    fp8: bool = True
    fp8_output: bool = False
    fp8_meta: dict = None
    max_seqlen_q: int = 128
    max_seqlen_kv: int = 128
    softmax_scale: float = 128**-0.5
    deterministic: bool = True


def _reason(params, cc=(9, 0), triton=True, onnx=False):
    return unsupported_reason(
        params,
        compute_capability=cc,
        head_dims=HEAD_DIMS,
        triton_available=triton,
        onnx_export=onnx,
    )


@pytest.mark.parametrize(
    "changes",
    [
        {},
        dict(qkv_dtype=torch.float16, head_dim_qk=64, head_dim_v=64),
        dict(qkv_layout="sb3hd", attn_mask_type="padding_causal"),
        dict(qkv_layout="thd_t2hd", attn_mask_type="padding_causal_bottom_right"),
        dict(attn_mask_type="no_mask", window_size=(-1, -1), bottom_right_diagonal=True),
        dict(attn_mask_type="padding", window_size=(32, 8), bottom_right_diagonal=True),
        dict(attn_mask_type="causal", window_size=(127, 0)),
        dict(attention_dropout=0.1, is_training=False),  # dropout only acts in training
        dict(cuda_graph=True),  # every format is captured
        dict(cuda_graph=True, qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="padding_causal"),
        dict(cuda_graph=True, qkv_layout="thd_thd_thd", attn_mask_type="padding_causal"),
    ],
)
def test_supported_configurations(changes):
    assert _reason(dataclasses.replace(Params(), **changes)) is None


@pytest.mark.parametrize(
    "changes,kwargs,fragment",
    [
        ({}, dict(triton=False), "Triton"),
        ({}, dict(cc=(8, 0)), "sm80"),
        ({}, dict(onnx=True), "ONNX"),
        (dict(qkv_dtype=torch.float32), {}, "qkv_dtype"),
        (dict(head_dim_qk=96, head_dim_v=96), {}, "head_dim_qk=96"),
        (dict(head_dim_qk=128, head_dim_v=64), {}, "head_dim_v=64"),
        (dict(attn_mask_type="arbitrary", window_size=(-1, -1)), {}, "arbitrary"),
        (
            dict(attn_mask_type="no_mask", window_size=(16, 16), bottom_right_diagonal=False),
            {},
            "top-left aligned sliding window",
        ),
        (dict(qkv_layout="thd_bshd_bshd"), {}, "formats differ"),
        (dict(inference_params=object()), {}, "KV caching"),
        (dict(context_parallel=True), {}, "context parallelism"),
        (dict(core_attention_bias_type="post_scale_bias"), {}, "post_scale_bias"),
        (dict(core_attention_bias_type="alibi"), {}, "alibi"),
        (dict(softcap=30.0), {}, "softcap"),
        (dict(softmax_type="off-by-one"), {}, "softmax_type"),
        (dict(attention_dropout=0.1), {}, "attention_dropout"),
        (dict(return_max_logit=True), {}, "return_max_logit"),
        (dict(has_score_mod=True), {}, "score_mod"),
    ],
)
def test_unsupported_configurations_name_their_reason(changes, kwargs, fragment):
    reason = _reason(dataclasses.replace(Params(), **changes), **kwargs)
    assert reason is not None and fragment in reason


@pytest.mark.parametrize(
    "layout,formats",
    [
        ("bshd_bshd_bshd", ("bshd", "bshd")),
        ("sbh3d", ("sbhd", "sbhd")),
        ("sbhd_sb2hd", ("sbhd", "sbhd")),
        ("t3hd", ("thd", "thd")),
        ("thd_th2d", ("thd", "thd")),
        ("sbhd_bshd_bshd", ("sbhd", "bshd")),
        ("paged_kv_thd_bshd_bshd", ("thd", "bshd")),
    ],
)
def test_qkv_formats(layout, formats):
    assert qkv_formats(layout) == formats


# ---------------------------------------------------------------------------------------------
# The recipe side, against upstream's recipe classes with patch 0001 applied


@pytest.fixture(scope="module")
def recipes(tmp_path_factory):
    """The patched `transformer_engine.common.recipe` module, loaded alone (it needs pydantic only)."""
    pytest.importorskip("pydantic", reason="upstream's recipe module needs pydantic")
    from build_tools import assemble, fetch

    root = tmp_path_factory.mktemp("fork")
    try:
        package = assemble.assemble(root)
    except fetch.ArtifactError as e:
        pytest.skip(f"the pinned upstream wheel is not available: {e}")
    path = package / "common" / "recipe" / "__init__.py"
    spec = importlib.util.spec_from_file_location("fork_recipe_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    module.package_dir = package
    return module


def test_patched_python_files_compile(recipes):
    for relative in (
        "pytorch/attention/dot_product_attention/dot_product_attention.py",
        "pytorch/attention/multi_head_attention.py",
        "pytorch/attention/dot_product_attention/utils.py",
        "pytorch/attention/dot_product_attention/exact_fp8/te/backend.py",
        "pytorch/attention/dot_product_attention/exact_fp8/te/selection.py",
    ):
        py_compile.compile(str(recipes.package_dir / relative), doraise=True)


def test_kernel_recipe(recipes):
    assert kernel_recipe(recipes.Float8CurrentScaling()) == "current"
    assert kernel_recipe(recipes.MXFP8BlockScaling()) == "mxfp8"
    assert kernel_recipe(recipes.DelayedScaling()) is None
    assert kernel_recipe(recipes.Float8BlockScaling()) is None


@pytest.mark.parametrize("field", [True, False])
def test_carry_into_the_recipes_of_the_switch(recipes, field):
    """NVTE_DPA_FP8_RECIPE: MXFP8 -> current scaling and current scaling -> MXFP8 keep the field."""
    cs = recipes.Float8CurrentScaling(fp8_dpa=True, fp8_dpa_mask_exact=field)
    mx = recipes.MXFP8BlockScaling(fp8_dpa=True, **carry_mask_exact(cs))
    assert mx.fp8_dpa_mask_exact is field
    assert recipes.Float8CurrentScaling(**carry_mask_exact(mx)).fp8_dpa_mask_exact is field
    assert f"fp8_dpa_mask_exact={field}" in repr(mx)


def test_sources_without_the_field_carry_nothing(recipes):
    """DelayedScaling has no field: the built recipe keeps the class default (the env variable)."""
    assert carry_mask_exact(recipes.DelayedScaling()) == {}
    default = recipes.Float8CurrentScaling().fp8_dpa_mask_exact
    built = recipes.Float8CurrentScaling(**carry_mask_exact(recipes.DelayedScaling()))
    assert built.fp8_dpa_mask_exact is default


def _fp8_meta(recipes, autocast, switch=""):
    """fp8_meta["recipe"] / ["local_recipes"] as DotProductAttention.init_fp8_metadata builds them
    (the table near its `NVTE_DPA_FP8_RECIPE` handling, with patch 0002's carrying)."""
    ds = lambda: recipes.DelayedScaling(fp8_dpa=autocast.fp8_dpa, fp8_mha=autocast.fp8_mha)
    flags = dict(fp8_dpa=autocast.fp8_dpa, fp8_mha=autocast.fp8_mha, **carry_mask_exact(autocast))
    if switch == "DelayedScaling":
        return {"recipe": ds(), "local_recipes": [ds()]}
    if switch == "MXFP8BlockScaling" and not autocast.mxfp8():
        built = recipes.MXFP8BlockScaling(**flags)
        return {"recipe": built, "local_recipes": [built]}
    if autocast.float8_current_scaling():
        return {"recipe": ds(), "local_recipes": [autocast, ds()]}
    if switch == "Float8CurrentScaling":
        return {"recipe": ds(), "local_recipes": [recipes.Float8CurrentScaling(**flags), ds()]}
    return {"recipe": autocast, "local_recipes": [autocast]}


@pytest.mark.parametrize(
    "autocast,switch,expected",
    [
        ("current", "", "current"),
        ("mxfp8", "", "mxfp8"),
        ("delayed", "", None),
        ("current", "DelayedScaling", None),
        ("current", "MXFP8BlockScaling", "mxfp8"),
        ("delayed", "MXFP8BlockScaling", "mxfp8"),
        ("mxfp8", "Float8CurrentScaling", "current"),
        ("delayed", "Float8CurrentScaling", "current"),
    ],
)
@pytest.mark.parametrize("field", [True, False])
def test_which_calls_run_mask_exact(recipes, autocast, switch, expected, field):
    make = {
        "current": recipes.Float8CurrentScaling,
        "mxfp8": recipes.MXFP8BlockScaling,
        "delayed": recipes.DelayedScaling,
    }[autocast]
    kwargs = {} if autocast == "delayed" else dict(fp8_dpa_mask_exact=field)
    meta = _fp8_meta(recipes, make(fp8_dpa=True, **kwargs), switch)
    chosen = mask_exact_recipe(True, meta)
    if autocast == "delayed":  # the built recipe has the class default
        field = recipes.Float8CurrentScaling().fp8_dpa_mask_exact
    want = expected if field else None
    assert (None if chosen is None else kernel_recipe(chosen)) == want
    assert mask_exact_recipe(False, meta) is None  # autocast off


def test_no_fp8_attention_no_mask_exact(recipes):
    meta = _fp8_meta(recipes, recipes.Float8CurrentScaling(fp8_dpa=False))
    assert mask_exact_recipe(True, meta) is None
    meta = _fp8_meta(recipes, recipes.MXFP8BlockScaling(fp8_mha=True))
    assert mask_exact_recipe(True, meta) is not None  # fp8_mha asks for FP8 attention too


def test_dpa_runs_mask_exact_builds_the_recipes_first(recipes):
    class FakeDPA:
        def init_fp8_metadata(self, num_gemms):
            assert num_gemms == 3
            self.fp8 = True
            self.fp8_meta = _fp8_meta(recipes, recipes.MXFP8BlockScaling(fp8_dpa=True))

    assert dpa_runs_mask_exact(FakeDPA())


# ---------------------------------------------------------------------------------------------
# Requests that cannot be mask-exact


class _Recipe:
    def __init__(self, fp8_mha=False):
        self.fp8_mha = fp8_mha


def test_check_request_accepts_plain_fp8_attention():
    check_request(_Recipe(), Params(fp8_meta={"recipe": _Recipe()}), qkv_quantized=False)


@pytest.mark.parametrize(
    "recipe,meta_recipe,params,quantized,fragment",
    [
        (_Recipe(fp8_mha=True), _Recipe(), {}, False, "one amax over all tokens"),
        (_Recipe(), _Recipe(fp8_mha=True), {}, False, "fp8_mha=True"),
        (_Recipe(), _Recipe(), dict(fp8_output=True), False, "fp8_output=True"),
        (_Recipe(), _Recipe(), {}, True, "already quantized"),
    ],
)
def test_check_request_refuses_leaky_requests(recipe, meta_recipe, params, quantized, fragment):
    params = Params(fp8_meta={"recipe": meta_recipe}, **params)
    with pytest.raises(ValueError, match=fragment) as error:
        check_request(recipe, params, qkv_quantized=quantized)
    assert "fp8_dpa_mask_exact=False" in str(error.value)


# ---------------------------------------------------------------------------------------------
# The cuDNN backward's inputs


def _lse_by_token(h, t):
    """lse[head, token] = 1000 * head + token: every entry names its own position."""
    return (1000.0 * torch.arange(h)[:, None] + torch.arange(t)[None, :]).float()


@pytest.mark.parametrize("qkv_format", ["bshd", "sbhd"])
def test_softmax_stats_dense(qkv_format):
    h, b, s = 3, 2, 5
    stats = lse_to_softmax_stats(_lse_by_token(h, b * s), qkv_format, b, s, ragged=False)
    assert stats.shape == (b, h, s, 1) and stats.is_contiguous()
    for bi, hi, si in [(0, 0, 0), (1, 2, 4), (1, 0, 3)]:
        assert stats[bi, hi, si, 0] == 1000 * hi + bi * s + si  # token (b, s) of the (b, s) axis


def test_softmax_stats_thd():
    h, t = 2, 11
    lse = _lse_by_token(h, t)
    ragged = lse_to_softmax_stats(lse, "thd", 2, 8, ragged=True)
    assert ragged.shape == (t, h, 1) and ragged[7, 1, 0] == 1007
    starts = torch.tensor([0, 4, 11], dtype=torch.int32)  # padded starts of 2 sequences
    padded = lse_to_softmax_stats(lse, "thd", 2, 8, ragged=False, cu_seqlens_q_padded=starts)
    assert padded.shape == (2, h, 8, 1)
    assert padded[1, 1, 2, 0] == 1000 + 4 + 2  # row 2 of sequence 1 is token 4 + 2


def test_softmax_stats_rows_that_see_nothing_get_plus_inf():
    lse = torch.tensor([[0.5, -math.inf, 2.0, -math.inf]])
    stats = lse_to_softmax_stats(lse, "bshd", 2, 2, ragged=False)
    assert stats.flatten().tolist() == [0.5, math.inf, 2.0, math.inf]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_roundtrip(dtype):
    """The round trip is the forward's quantization, dequantized in fp32 with one rounding."""
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(2, 7, 4, 64, generator=gen) * 3).to(dtype)
    data, codes = per_block_cast_to_mxfp8_rowwise(x)
    mx = fp8_roundtrip(x, "mxfp8", False)
    assert mx.dtype == dtype and mx.is_contiguous()
    assert torch.equal(mx.double(), dequantize_mxfp8_rowwise(data, codes, torch.float64))  # exact
    for power_2 in (False, True):
        data, scale_inv = per_token_cast_to_fp8(x, use_power_2_scales=power_2)
        exact = dequantize(data, scale_inv.unsqueeze(-1), torch.float64)
        assert torch.equal(fp8_roundtrip(x, "current", power_2), exact.to(dtype))
    with pytest.raises(ValueError, match="recipe"):
        fp8_roundtrip(x, "delayed", False)


def _flash_backward_fp64(q, k, v, out, d_out, stats, mask, scale):
    """The math of a flash-style backward for one bshd sample, reading cuDNN's [b, h, s, 1]
    stats: P = exp(S - stats), D = rowsum(dO * O), dS = P (dP - D). fp64; returns dq, dk, dv."""
    qh, kh, vh, oh, doh = (x[0].double().transpose(0, 1) for x in (q, k, v, out, d_out))
    rep = qh.shape[0] // kh.shape[0]
    kh, vh = kh.repeat_interleave(rep, 0), vh.repeat_interleave(rep, 0)
    allowed = allowed_positions(mask, None, qh.shape[1], kh.shape[1])
    p = torch.exp(qh @ kh.transpose(1, 2) * scale - stats[0].double()).masked_fill(~allowed, 0)
    dp = doh @ vh.transpose(1, 2)
    ds = p * (dp - (doh * oh).sum(-1, keepdim=True))
    dq, dk, dv = ds @ kh * scale, ds.transpose(1, 2) @ qh * scale, p.transpose(1, 2) @ doh
    dk, dv = (x.unflatten(0, (-1, rep)).sum(1) for x in (dk, dv))
    return [x.transpose(0, 1)[None] for x in (dq, dk, dv)]


def _exact_grads(q, k, v, d_out, mask):
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    out = reference_attention("bf16", *leaves, attn_mask_type=mask).out
    return torch.autograd.grad(out, leaves, d_out.double())


EMULATED_GRAD_ERROR_BOUND = 0.06
"""Relative Frobenius error bound of the gradients of the emulated cuDNN backward (random inputs,
no outliers). The GPU test allows 0.08 (GRAD_RTOL there): this bound plus BF16 rounding."""


@pytest.mark.parametrize("path,recipe", [("fork-current", "current"), ("fork-mxfp8", "mxfp8")])
def test_backward_inputs_give_gradients_within_tolerance(path, recipe):
    """Feed the math of cuDNN's backward exactly what cudnn_backward feeds it (round-tripped Q/K,
    the FP8 forward's O, its LSE in cuDNN's layout): gradients stay within the GPU tolerance."""
    gen = torch.Generator().manual_seed(2)
    b, s, h, h_kv, d = 1, 384, 4, 2, 128
    q = torch.randn(b, s, h, d, generator=gen).bfloat16()
    k, v = (torch.randn(b, s, h_kv, d, generator=gen).bfloat16() for _ in range(2))
    d_out = torch.randn(b, s, h, d, generator=gen).bfloat16()
    fwd = reference_attention(path, q, k, v, attn_mask_type="causal")
    stats = lse_to_softmax_stats(fwd.lse.float(), "bshd", b, s, ragged=False)
    q_deq, k_deq = (fp8_roundtrip(x, recipe, False) for x in (q, k))
    got = _flash_backward_fp64(q_deq, k_deq, v, fwd.out, d_out, stats, "causal", d**-0.5)
    for g, want in zip(got, _exact_grads(q, k, v, d_out, "causal")):
        assert rel_frobenius_error(g, want) < EMULATED_GRAD_ERROR_BOUND


@pytest.mark.parametrize("path,recipe", [("fork-current", "current"), ("fork-mxfp8", "mxfp8")])
def test_roundtrip_keeps_the_backward_well_conditioned(path, recipe):
    """Note [BF16 backward of the FP8 forward]: with outliers, the FP8 forward's LSE paired with
    the unquantized Q, K blows gradients up; with the round-tripped Q, K they stay bounded."""
    gen = torch.Generator().manual_seed(3)
    b, s, h, d = 1, 256, 2, 128
    q, k, v = (torch.randn(b, s, h, d, generator=gen) for _ in range(3))
    for x in (q, k, v):
        x[torch.rand(x.shape, generator=gen) < 1e-3] *= 50
    q, k, v = (x.bfloat16() for x in (q, k, v))
    d_out = torch.randn(b, s, h, d, generator=gen).bfloat16()
    fwd = reference_attention(path, q, k, v, attn_mask_type="causal")
    stats = lse_to_softmax_stats(fwd.lse.float(), "bshd", b, s, ragged=False)
    exact = _exact_grads(q, k, v, d_out, "causal")
    q_deq, k_deq = (fp8_roundtrip(x, recipe, False) for x in (q, k))
    consistent = _flash_backward_fp64(q_deq, k_deq, v, fwd.out, d_out, stats, "causal", d**-0.5)
    naive = _flash_backward_fp64(q, k, v, fwd.out, d_out, stats, "causal", d**-0.5)
    assert max(rel_frobenius_error(g, e) for g, e in zip(consistent, exact)) < 0.3
    assert max(rel_frobenius_error(g, e) for g, e in zip(naive, exact)) > 0.3


# ---------------------------------------------------------------------------------------------
# The recompute backward


def _call(qkv_format, mask, window, cu_q, cu_kv, pad_q=None, pad_kv=None, deterministic=False):
    return AttentionCall(
        recipe="current",
        use_power_2_scales=False,
        qkv_format=qkv_format,
        attn_mask_type=mask,
        window_size=window,
        bottom_right_diagonal="bottom_right" in mask,
        softmax_scale=0.125,
        max_seqlen_q=0,
        max_seqlen_kv=0,
        deterministic=deterministic,
        backward="recompute",
        cu_seqlens_q=cu_q,
        cu_seqlens_kv=cu_kv,
        cu_seqlens_q_padded=pad_q,
        cu_seqlens_kv_padded=pad_kv,
    )


def _cu(lens):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)


def _reference_grads(q, k, v, d_out, call):
    """fp64 gradients of masked softmax attention written out directly (no SDPA): masked scores
    are -1e300 rather than -inf, and rows that see nothing are multiplied by 0, so such rows give
    zero gradients instead of NaN."""
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    q_t, k_t, v_t = (to_tokens(x, call.qkv_format) for x in leaves)
    layout_q, layout_kv = _layouts(q, k, call)
    out = torch.zeros_like(q_t)
    for _, rows, cols, allowed in sequence_masks(
        layout_q, layout_kv, call.attn_mask_type, call.window_size
    ):
        qh, kh, vh = (x.transpose(0, 1) for x in (q_t[rows], k_t[cols], v_t[cols]))
        rep = qh.shape[0] // kh.shape[0]
        kh, vh = kh.repeat_interleave(rep, 0), vh.repeat_interleave(rep, 0)
        scores = (qh @ kh.transpose(1, 2) * call.softmax_scale).masked_fill(~allowed, -1e300)
        o = torch.softmax(scores, dim=-1) @ vh * allowed.any(-1, keepdim=True)
        out[rows] = o.transpose(0, 1)
    return torch.autograd.grad(out, leaves, to_tokens(d_out, call.qkv_format))


def _layouts(q, k, call):
    batch = call.batch_size(q)
    cu_q, cu_kv, pad_q, pad_kv = call.seqlens(batch)
    if call.qkv_format == "thd":
        return SeqLayout.varlen(cu_q, pad_q), SeqLayout.varlen(cu_kv, pad_kv)
    s_dim = 1 if call.qkv_format == "bshd" else 0
    lens = lambda cu: (cu[1:] - cu[:-1]).tolist()
    return (
        SeqLayout.dense(batch, q.shape[s_dim], lens(cu_q)),
        SeqLayout.dense(batch, k.shape[s_dim], lens(cu_kv)),
    )


@pytest.mark.parametrize(
    "qkv_format,mask,window,s_q,s_kv,lens",
    [
        ("bshd", "causal", (-1, 0), 40, 40, None),
        ("sbhd", "padding_causal", (-1, 0), 40, 40, [33, 40]),
        ("bshd", "causal_bottom_right", (-1, 0), 24, 40, None),
        ("sbhd", "causal", (7, 0), 40, 40, None),
        ("bshd", "no_mask", (5, 3), 40, 48, None),
        ("bshd", "padding_causal_bottom_right", (-1, 0), 48, 40, [48, 20]),
    ],
)
@pytest.mark.parametrize("deterministic", [False, True])
def test_recompute_backward_dense(qkv_format, mask, window, s_q, s_kv, lens, deterministic):
    gen = torch.Generator().manual_seed(4)
    shape = lambda s, h: (2, s, h, 16) if qkv_format == "bshd" else (s, 2, h, 16)
    q = torch.randn(shape(s_q, 4), generator=gen, dtype=torch.float64)
    k, v = (torch.randn(shape(s_kv, 2), generator=gen, dtype=torch.float64) for _ in range(2))
    d_out = torch.randn(q.shape, generator=gen, dtype=torch.float64)
    lens_q = lens if lens is not None else [s_q, s_q]
    lens_kv = [min(x, s_kv) for x in lens] if lens is not None else [s_kv, s_kv]
    call = _call(qkv_format, mask, window, _cu(lens_q), _cu(lens_kv), deterministic=deterministic)
    got = recompute_backward(q, k, v, d_out, call)
    for g, w in zip(got, _reference_grads(q, k, v, d_out, call)):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


def test_recompute_backward_thd_with_padding_between_sequences():
    """Packed sequences with gaps get the gradients of the same sequences packed densely; the
    gap tokens get none."""
    gen = torch.Generator().manual_seed(5)
    lens, gaps = [9, 30, 17], [3, 0, 5]
    dense = [torch.randn(sum(lens), h, 16, generator=gen, dtype=torch.float64) for h in (4, 2, 2)]
    d_out = torch.randn(sum(lens), 4, 16, generator=gen, dtype=torch.float64)
    cu = _cu(lens)
    call = _call("thd", "padding_causal", (-1, 0), cu, cu)
    want = recompute_backward(*dense, d_out, call)
    for w, r in zip(want, _reference_grads(*dense, d_out, call)):
        torch.testing.assert_close(w, r, rtol=1e-10, atol=1e-10)

    padded_cu = _cu([n + g for n, g in zip(lens, gaps)])
    real = torch.cat([torch.arange(a, a + n) for a, n in zip(padded_cu[:-1].tolist(), lens)])

    def spread(x):
        out = torch.full((int(padded_cu[-1]),) + x.shape[1:], 7.0, dtype=x.dtype)
        out[real] = x
        return out

    call = _call("thd", "padding_causal", (-1, 0), cu, cu, padded_cu, padded_cu)
    got = recompute_backward(*(spread(x) for x in dense), spread(d_out), call)
    gap = torch.ones(int(padded_cu[-1]), dtype=torch.bool)
    gap[real] = False
    for g, w in zip(got, want):
        torch.testing.assert_close(g[real], w, rtol=1e-10, atol=1e-10)
        assert torch.equal(g[gap], torch.zeros_like(g[gap]))


def test_recompute_backward_rows_that_see_nothing_get_no_gradient():
    """Bottom-right causal with s_q > s_kv: the first s_q - s_kv rows see no key."""
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(1, 12, 2, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, 8, 2, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    d_out = torch.randn(q.shape, generator=gen, dtype=torch.float64)
    call = _call("bshd", "causal_bottom_right", (-1, 0), _cu([12]), _cu([8]))
    dq, dk, dv = recompute_backward(q, k, v, d_out, call)
    assert torch.equal(dq[:, :4], torch.zeros_like(dq[:, :4]))
    assert torch.isfinite(dk).all() and torch.isfinite(dv).all()
    for g, w in zip((dq, dk, dv), _reference_grads(q, k, v, d_out, call)):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# dispatch -> Dispatch.run -> autograd, with the Triton kernel replaced by the reference rules


@dataclasses.dataclass
class FakeDPA:
    fp8: bool
    fp8_meta: dict
    logger: logging.Logger = logging.getLogger("DotProductAttention")


@pytest.fixture
def fake_kernel(monkeypatch):
    """kernels.attention_forward computed by the reference rules (fp32 math); records calls."""
    calls = []

    def forward(q, k, v, *, recipe, qkv_format, attn_mask_type, window_size, cu_seqlens_q,
                cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded, max_seqlen_q,
                max_seqlen_kv, softmax_scale, use_power_2_scales):  # fmt: skip
        calls.append(dict(recipe=recipe, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q))
        # what attention_forward records: the backend its choice would run
        monkeypatch.setitem(
            kernels._last, "backend", kernels.choose_backend(q, k, v, recipe=recipe)
        )
        lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).tolist()
        result = reference_attention(
            f"fork-{recipe}", q, k, v, qkv_format=qkv_format, attn_mask_type=attn_mask_type,
            window_size=window_size, seqlens_q=lens, seqlens_kv=lens, softmax_scale=softmax_scale,
            quant=QuantConfig(use_power_2_scales=use_power_2_scales), compute_dtype=torch.float32,
        )  # fmt: skip
        return result.out, result.lse.float()

    monkeypatch.setattr(kernels, "attention_forward", forward)
    monkeypatch.setattr(
        backend,
        "_device_support",
        lambda: dict(
            compute_capability=(9, 0), head_dims=HEAD_DIMS, triton_available=True, onnx_export=False
        ),
    )
    monkeypatch.setattr(backend, "_select_backward", lambda params: "recompute")
    return calls


def _sbhd_call(recipes, field=True, head_dim=128, **changes):
    autocast = recipes.Float8CurrentScaling(fp8_dpa=True, fp8_dpa_mask_exact=field)
    dpa = FakeDPA(fp8=True, fp8_meta=_fp8_meta(recipes, autocast))
    params = Params(
        qkv_layout="sbhd_sbhd_sbhd",
        attn_mask_type="padding_causal",
        head_dim_qk=head_dim,
        head_dim_v=head_dim,
        max_seqlen_q=96,
        max_seqlen_kv=96,
        softmax_scale=head_dim**-0.5,
        fp8_meta=dpa.fp8_meta,
        **changes,
    )
    return dpa, params


def test_dispatch_runs_the_kernel_through_autograd(recipes, fake_kernel):
    dpa, params = _sbhd_call(recipes)
    selected = backend.dispatch(dpa, params)
    assert selected.runs and selected.recipe == "current" and selected.attention_params is params
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(96, 2, 4, 128, generator=gen).bfloat16().requires_grad_()
    k, v = (torch.randn(96, 2, 2, 128, generator=gen).bfloat16().requires_grad_() for _ in "kv")
    cu = torch.tensor([0, 80, 176, 176], dtype=torch.int32)  # TE may pass more than b + 1 entries
    out = selected.run(q, k, v, cu, cu, None, None)
    assert out.shape == (96, 2, 4 * 128)
    assert torch.equal(fake_kernel[0]["cu_seqlens_q"], cu[:3])
    want = reference_attention(
        "fork-current", q, k, v, qkv_format="sbhd", attn_mask_type="padding_causal",
        seqlens_q=[80, 96], seqlens_kv=[80, 96], compute_dtype=torch.float32,
    ).out  # fmt: skip
    assert torch.equal(out, want.view(96, 2, -1))
    d_out = torch.randn(out.shape, generator=gen).bfloat16()
    grads = torch.autograd.grad(out, (q, k, v), d_out)
    call = AttentionCall(
        recipe="current", use_power_2_scales=False, qkv_format="sbhd",
        attn_mask_type="padding_causal", window_size=(-1, 0), bottom_right_diagonal=False,
        softmax_scale=128**-0.5, max_seqlen_q=96, max_seqlen_kv=96, deterministic=True,
        backward="recompute", cu_seqlens_q=cu, cu_seqlens_kv=cu,
    )  # fmt: skip
    direct = recompute_backward(q, k, v, d_out.view(96, 2, 4, 128), call)
    assert all(torch.equal(g, w) for g, w in zip(grads, direct))


def test_dispatch_without_grad_saves_nothing(recipes, fake_kernel):
    dpa, params = _sbhd_call(recipes)
    x = torch.randn(96, 2, 4, 128).bfloat16()
    kv = torch.randn(96, 2, 2, 128).bfloat16()
    cu = torch.tensor([0, 96, 192], dtype=torch.int32)
    with torch.no_grad():
        out = backend.dispatch(dpa, params).run(x, kv, kv, cu, cu, None, None)
    assert out.grad_fn is None and len(fake_kernel) == 1


def test_dispatch_falls_back_with_a_logged_reason(recipes, fake_kernel, caplog):
    dpa, params = _sbhd_call(recipes, head_dim=96)
    caplog.set_level(logging.DEBUG, logger="DotProductAttention")
    selected = backend.dispatch(dpa, params)
    assert not selected.runs
    assert selected.attention_params.fp8 is False and params.fp8 is True  # a copy, FP8 off
    assert "Disabling mask-exact FP8 attention for head_dim_qk=96" in caplog.text


@pytest.mark.parametrize(
    "backward,is_training,runs",
    [("recompute", True, False), ("cudnn", True, True), ("recompute", False, True)],
)
def test_dispatch_under_cuda_graph_capture(
    backward, is_training, runs, recipes, fake_kernel, monkeypatch, caplog
):
    """Calls run under capture, unless a training step's backward would recompute."""
    monkeypatch.setattr(backend, "_select_backward", lambda params: backward)
    monkeypatch.setattr(backend, "_backward_cache", [])
    dpa, params = _sbhd_call(recipes, cuda_graph=True, is_training=is_training)
    caplog.set_level(logging.DEBUG, logger="DotProductAttention")
    assert backend.dispatch(dpa, params).runs is runs
    assert ("CUDA graph capture of a training step" in caplog.text) is not runs


def test_dispatch_leaves_upstream_alone_when_the_field_is_off(recipes, fake_kernel):
    dpa, params = _sbhd_call(recipes, field=False)
    selected = backend.dispatch(dpa, params)
    assert not selected.runs and selected.attention_params is params


def test_dispatch_refuses_fp8_output(recipes, fake_kernel):
    dpa, params = _sbhd_call(recipes, fp8_output=True)
    with pytest.raises(ValueError, match="fp8_output"):
        backend.dispatch(dpa, params)


# ---------------------------------------------------------------------------------------------
# What the dispatch records (te/status.py) and logs


@pytest.fixture
def fresh_status(monkeypatch):
    monkeypatch.setattr(status, "_announced", False)
    monkeypatch.setattr(status, "_warned", set())
    status.reset()
    yield
    status.reset()


def test_dispatch_records_the_runs_and_logs_the_first(recipes, fake_kernel, fresh_status, caplog):
    caplog.set_level(logging.INFO, logger="DotProductAttention")
    dpa, params = _sbhd_call(recipes)
    x = torch.randn(96, 2, 4, 128).bfloat16()
    cu = torch.tensor([0, 96, 192], dtype=torch.int32)
    selected = backend.dispatch(dpa, params)
    assert status.status().mask_exact_calls == 0  # selected, not yet run
    for _ in range(2):
        selected.run(x, x, x, cu, cu, None, None)
    s = status.status()
    assert (s.mask_exact_calls, s.last_recipe, s.fallbacks) == (2, "current", {})
    assert s.last_kernel_backend == kernels.select_backend() == "triton"
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and "recipe current, kernel backend triton" in infos[0]


def test_dispatch_records_fallbacks_by_reason(recipes, fake_kernel, fresh_status, caplog):
    caplog.set_level(logging.DEBUG, logger="DotProductAttention")
    for _ in range(2):
        dpa, params = _sbhd_call(recipes, head_dim=96)
        assert not backend.dispatch(dpa, params).runs
    backend.dispatch(*_sbhd_call(recipes, field=False))  # not asked: not recorded
    (reason,) = status.status().fallbacks
    assert reason.startswith("head_dim_qk=96") and status.status().fallbacks[reason] == 2
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    "support,reason",
    [
        (dict(triton_available=False), status.TRITON_MISSING),
        (dict(extension_available=False), status.EXTENSION_MISSING),
    ],
)
def test_a_missing_dependency_falls_back_with_one_warning(
    support, reason, recipes, fake_kernel, fresh_status, monkeypatch, caplog
):
    full = dict(
        compute_capability=(9, 0), head_dims=HEAD_DIMS, triton_available=True, onnx_export=False
    )
    monkeypatch.setattr(backend, "_device_support", lambda: {**full, **support})
    caplog.set_level(logging.DEBUG, logger="DotProductAttention")
    for _ in range(3):
        dpa, params = _sbhd_call(recipes)
        selected = backend.dispatch(dpa, params)
        assert not selected.runs and selected.attention_params.fp8 is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and reason in warnings[0]
    assert status.status().fallbacks == {reason: 3}


def test_mask_exact_decision_answers_without_recording(recipes, fake_kernel, fresh_status):
    support = dict(compute_capability=(9, 0), head_dims=HEAD_DIMS, triton_available=True)
    _, params = _sbhd_call(recipes)
    decision = backend.mask_exact_decision(params, device_support=support)
    assert decision.asked and decision.runs and decision.kernel_recipe == "current"
    _, params = _sbhd_call(recipes, head_dim=96)
    decision = backend.mask_exact_decision(params, device_support=support)
    assert decision.asked and not decision.runs and decision.reason.startswith("head_dim_qk=96")
    _, params = _sbhd_call(recipes, field=False)
    assert not backend.mask_exact_decision(params, device_support=support).asked
    _, params = _sbhd_call(recipes, fp8=False)
    assert not backend.mask_exact_decision(params, device_support=support).asked
    _, params = _sbhd_call(recipes, fp8_output=True)
    with pytest.raises(ValueError, match="fp8_output"):
        backend.mask_exact_decision(params, device_support=support)
    assert status.status() == status.MaskExactStatus()


def test_unsupported_reason_without_the_extension():
    assert _reason(Params()) is None
    reason = unsupported_reason(
        Params(),
        compute_capability=(9, 0),
        head_dims=HEAD_DIMS,
        triton_available=True,
        extension_available=False,
    )
    assert reason == status.EXTENSION_MISSING


# ---------------------------------------------------------------------------------------------
# te/selection.py: what upstream's get_attention_backend reports (patch 0005)

SM90 = dict(compute_capability=(9, 0), head_dims=HEAD_DIMS, triton_available=True)


def test_selection_reports_the_mask_exact_backend_on_sm90(recipes, fresh_status, caplog):
    caplog.set_level(logging.DEBUG, logger="DotProductAttention")
    _, params = _sbhd_call(recipes)  # Float8CurrentScaling(fp8_dpa=True): upstream has none on sm90
    chosen = selection.select(params, device_support=SM90)
    flash, flash_backend, fused, fused_backend, unfused, available = chosen.backend
    assert (flash, flash_backend, fused, unfused, available) == (
        False,
        None,
        True,
        False,
        [False, True, False],
    )
    assert selection.is_mask_exact_backend(fused_backend) and int(fused_backend) == -1
    assert not selection.is_mask_exact_backend(-1) and not selection.is_mask_exact_backend(1)
    assert "mask-exact FP8 attention" in str(fused_backend) == repr(fused_backend)
    assert "Selected backend = FusedAttention slot: mask-exact FP8 attention" in caplog.text
    assert "recipe current, kernel backend triton" in caplog.text
    assert status.status() == status.MaskExactStatus()  # a question, not a call


def test_selection_continues_upstreams_with_what_runs(recipes, fresh_status):
    _, params = _sbhd_call(recipes, head_dim=96)  # the fork falls back: BF16 is what runs
    chosen = selection.select(params, device_support=SM90)
    assert chosen.backend is None and chosen.attention_params.fp8 is False and params.fp8
    _, params = _sbhd_call(recipes)
    chosen = selection.select(params, device_support=dict(SM90, compute_capability=(8, 0)))
    assert chosen.backend is None and chosen.attention_params.fp8 is False
    for changes in (dict(field=False), dict(fp8=False), dict(fp8_output=True)):
        _, params = _sbhd_call(recipes, **changes)  # not asked, or refused: upstream's, as is
        chosen = selection.select(params, device_support=SM90)
        assert chosen.backend is None and chosen.attention_params is params
    assert status.status() == status.MaskExactStatus()


class _UpstreamSelectionContinues(Exception):
    """Raised by the stand-in of the first function upstream's own selection calls after patch
    0005's hook; carries the value of get_attention_backend's local `fp8` at that point."""

    @classmethod
    def raise_with_fp8(cls, *args):
        raise cls(sys._getframe(1).f_locals["fp8"])


def _patched_get_attention_backend(recipes, monkeypatch):
    """Upstream's get_attention_backend with patch 0005, compiled alone from the patched utils.py,
    its module globals replaced by stand-ins for an H200 (TE's core library is not here)."""
    import ast
    import os
    import types

    source = (recipes.package_dir / "pytorch/attention/dot_product_attention/utils.py").read_text()
    (func,) = [
        n
        for n in ast.parse(source).body
        if isinstance(n, ast.FunctionDef) and n.name == "get_attention_backend"
    ]
    fields_read = sorted(
        {
            n.attr
            for n in ast.walk(func)
            if isinstance(n, ast.Attribute) and getattr(n.value, "id", "") == "attention_params"
        }
    )
    flash = types.SimpleNamespace(
        version=None,
        is_installed=False,
        fa3_version=None,
        v3_is_installed=False,
        fa4_version=None,
        v4_is_installed=False,
    )
    logging_stub = types.SimpleNamespace(
        _log_level=logging.DEBUG, _stream_handler=logging.Handler()
    )
    namespace = dict(
        torch=torch,
        os=os,
        logging=logging,
        fields=dataclasses.fields,
        AttentionParams=object,
        AttentionLogging=logging_stub,
        no_op_logger=None,
        get_device_compute_capability=lambda: (9, 0),
        get_cudnn_version=lambda: (9, 19, 0),
        te=types.SimpleNamespace(__version__="2.20.2"),
        FlashAttentionUtils=flash,
        exact_fp8_selection=selection,
        get_qkv_format=_UpstreamSelectionContinues.raise_with_fp8,
    )
    module = ast.Module(body=[func], type_ignores=[])
    exec(compile(module, "patched utils.py", "exec"), namespace)
    monkeypatch.setattr(backend, "_device_support", lambda: dict(SM90, onnx_export=False))
    return namespace["get_attention_backend"], fields_read


def test_patched_get_attention_backend_reports_mask_exact_on_sm90(
    recipes, monkeypatch, fresh_status, caplog
):
    """What upstream's tests and helpers see: current scaling FP8 attention on sm90 has a backend."""
    get_attention_backend, fields_read = _patched_get_attention_backend(recipes, monkeypatch)
    _, base = _sbhd_call(recipes)
    known = {f.name for f in dataclasses.fields(Params)}
    extra = [(name, object, None) for name in fields_read if name not in known]
    full = dataclasses.make_dataclass("AttentionParams", extra, bases=(Params,))
    make = lambda base: full(**{f.name: getattr(base, f.name) for f in dataclasses.fields(Params)})
    caplog.set_level(logging.DEBUG, logger="DotProductAttention")
    result = get_attention_backend(make(base))
    assert result[:3] == (False, None, True) and result[4:] == (False, [False, True, False])
    assert selection.is_mask_exact_backend(result[3])
    assert "Selected backend = FusedAttention slot: mask-exact FP8 attention" in caplog.text
    # A fallback continues upstream's selection with FP8 off; a call not asking, unchanged.
    for changes, fp8 in ((dict(head_dim=96), False), (dict(field=False), True)):
        with pytest.raises(_UpstreamSelectionContinues) as continued:
            get_attention_backend(make(_sbhd_call(recipes, **changes)[1]))
        assert continued.value.args == (fp8,)
