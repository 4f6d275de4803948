"""GPU tests of the mask-exact FP8 attention forward (triton/attention.py / triton/attention_kernel.py).

Headline: bitwise invariance (torch.equal) of the kernel's outputs under every perturbation the
mask hides, both recipes, hundreds of randomized cases, with the leaky fp8_v_everywhere mode as
the negative control that must be caught. Also: the in-kernel Q cast equals the reference cast
bit for bit, the E8M0 decode equals formats.e8m0_to_float bit for bit on the GPU, and accuracy
against the fp64 reference over layouts, masks, GQA, head dims and dtypes.
"""

import pytest
import torch
import triton
import triton.language as tl

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton import attention
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import formats
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton.attention import (
    exact_fp8_attention_forward,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton.scaling import (
    e8m0_to_fp32,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.quantize import (
    per_block_cast_to_mxfp8_rowwise,
    per_token_cast_to_fp8,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.attention import (
    QuantConfig,
    reference_attention,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import to_tokens
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.sequences import sequences
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.audit.scenarios import (
    REPORT_SCENARIOS,
    RANDOM_SCENARIOS,
    Scenario,
    build_scenario,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
    HUGE_ROW_SCALES,
    one_hot_self_scores,
    prefix_change,
    rel_frobenius_error,
)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="needs a CUDA GPU with FP8 tensor cores (compute capability >= 8.9)",
)

RECIPES = ("current", "mxfp8")
SEEDS_PER_SCENARIO = 24  # 8 random scenarios x 2 recipes x 24 seeds = 384 randomized cases


def _kernel_kwargs(kwargs):
    """Reference kwargs -> kernel kwargs: dense padding lengths travel as cu_seqlens."""
    kw = dict(kwargs)
    for side in ("q", "kv"):
        lens = kw.pop(f"seqlens_{side}", None)
        if lens is not None:
            kw[f"cu_seqlens_{side}"] = torch.tensor([0] + list(lens)).cumsum(0).int().cuda()
        elif kw.get(f"cu_seqlens_{side}") is not None:
            kw[f"cu_seqlens_{side}"] = kw[f"cu_seqlens_{side}"].cuda()
    return kw


def _forward(q, k, v, recipe, kwargs, **extra):
    q, k, v = (x.cuda() for x in (q, k, v))
    return exact_fp8_attention_forward(q, k, v, recipe=recipe, **_kernel_kwargs(kwargs), **extra)


def _change(sc: Scenario, recipe, leaky=False):
    """(max |change|, changed elements) of the protected outputs under the perturbation."""
    fmt = sc.kwargs["qkv_format"]
    base, _ = _forward(sc.q, sc.k, sc.v, recipe, sc.kwargs, fp8_v_everywhere=leaky)
    pert, _ = _forward(sc.q2, sc.k2, sc.v2, recipe, sc.kwargs, fp8_v_everywhere=leaky)
    return prefix_change(to_tokens(base, fmt).cpu(), to_tokens(pert, fmt).cpu(), sc.protected)


def _diagonal_outlier() -> Scenario:
    """report-current-future with its outlier inside the diagonal tile (V[16, 0] = 1024)."""
    sc = build_scenario("report-current-future")
    sc.v2 = sc.v.clone()
    sc.v2[16, 0, 0, 0] = 1024.0
    return sc


def _padded_thd(gen) -> Scenario:
    """thd padding_causal with cu_seqlens_padded: garbage between sequences changes nothing."""
    lens = [int(x) for x in torch.randint(60, 300, (3,), generator=gen)]
    pads = [int(x) for x in torch.randint(1, 70, (3,), generator=gen)]
    cu = torch.tensor([0] + lens).cumsum(0).int()
    cu_pad = torch.tensor([0] + [a + b for a, b in zip(lens, pads)]).cumsum(0).int()
    t = int(cu_pad[-1])
    real = torch.zeros(t, dtype=torch.bool)
    for start, n in zip(cu_pad[:-1].tolist(), lens):
        real[start : start + n] = True
    x = [(torch.randn(t, 2, 64, generator=gen)).bfloat16() for _ in range(3)]
    garbage = [
        torch.where(real.view(t, 1, 1), y, 3e4 * torch.randn(t, 2, 64, generator=gen)).bfloat16()
        for y in x
    ]
    kw = dict(
        qkv_format="thd", attn_mask_type="padding_causal", cu_seqlens_q=cu, cu_seqlens_kv=cu,
        cu_seqlens_q_padded=cu_pad, cu_seqlens_kv_padded=cu_pad,
    )  # fmt: skip
    return Scenario("padded-thd-garbage", *x, *garbage, real, kw)


# -------------------------------------------------------------------- exactness (headline)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("name", sorted(RANDOM_SCENARIOS) + ["padded-thd-garbage"])
def test_hidden_tokens_change_no_output_bit(recipe, name):
    violations = []
    for seed in range(SEEDS_PER_SCENARIO):
        gen = torch.Generator().manual_seed(1000 + seed)
        sc = _padded_thd(gen) if name == "padded-thd-garbage" else build_scenario(name, gen)
        max_abs, changed = _change(sc, recipe)
        if changed:
            violations.append((seed, changed, max_abs))
    print(f"exactness {name} {recipe}: cases={SEEDS_PER_SCENARIO} violations={len(violations)}")
    assert not violations, f"{name}/{recipe}: (seed, changed, max_abs) {violations}"


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("name", list(REPORT_SCENARIOS) + ["diagonal-tile-outlier"])
def test_bug_report_scenarios_change_nothing(recipe, name):
    sc = _diagonal_outlier() if name == "diagonal-tile-outlier" else build_scenario(name)
    max_abs, changed = _change(sc, recipe)
    print(f"exactness {name} {recipe}: cases=1 violations={int(changed > 0)}")
    assert changed == 0, f"{changed} protected outputs changed (max {max_abs})"


@pytest.mark.parametrize(
    "scenario,recipe",
    [(lambda: build_scenario("report-mx-same-block"), "mxfp8"), (_diagonal_outlier, "current")],
    ids=["report-mx-same-block", "diagonal-tile-outlier"],
)
def test_negative_control_leaky_mode_is_caught(scenario, recipe):
    """fp8_v_everywhere=True quantizes the diagonal tile's V too: the checks must catch it."""
    max_abs, changed = _change(scenario(), recipe, leaky=True)
    print(f"negative-control {recipe}: changed={changed} max_abs={max_abs:.10e}")
    assert changed > 0


@pytest.mark.parametrize("recipe", RECIPES)
def test_negative_control_randomized_future_v(recipe):
    """The leaky mode must also be caught on most random future-V cases (not just hand-made)."""
    caught = 0
    for seed in range(SEEDS_PER_SCENARIO):
        sc = build_scenario("random-future-v", torch.Generator().manual_seed(2000 + seed))
        caught += _change(sc, recipe, leaky=True)[1] > 0
    print(f"negative-control random-future-v {recipe}: caught {caught}/{SEEDS_PER_SCENARIO}")
    assert caught >= SEEDS_PER_SCENARIO // 2


# -------------------------------------------------------------------- bitwise pieces


def _outlier_rows(gen, shape, dtype):
    """N(0, 1) with x50 outliers, a zero token and a subnormal token (the degenerate rules)."""
    x = torch.randn(*shape, generator=gen)
    x = torch.where(torch.rand(*shape, generator=gen) < 0.01, 50 * x, x)
    tokens = x.view(-1, *shape[-2:])  # [tokens, h, d] in memory order
    tokens[0] = 0.0
    tokens[1] = 1e-40 if dtype == torch.bfloat16 else 1e-7
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "recipe,quant",
    [
        ("current", QuantConfig()),
        ("current", QuantConfig(use_power_2_scales=True)),
        ("current", QuantConfig(amax_epsilon=1e-3)),
        ("mxfp8", QuantConfig()),
    ],
)
def test_in_kernel_q_cast_equals_reference_cast(recipe, quant, dtype):
    """Quantizing Q inside the kernel gives the same output bits as a Q quantized by the
    reference rules (scales, division rounding, degenerate amax rules, the E4M3 cast)."""
    gen = torch.Generator().manual_seed(7)
    q, k, v = (_outlier_rows(gen, (2, 300, 4, 128), dtype) for _ in range(3))
    kw = dict(use_power_2_scales=quant.use_power_2_scales, amax_epsilon=quant.amax_epsilon)
    tokens = to_tokens(q, "bshd")
    if recipe == "current":
        data, scale = per_token_cast_to_fp8(tokens, **kw)
    else:
        data, scale = per_block_cast_to_mxfp8_rowwise(tokens)
        kw = {}
    q_fp8 = (data.transpose(0, 1).contiguous().cuda(), scale.transpose(0, 1).contiguous().cuda())
    inside = _forward(q, k, v, recipe, dict(qkv_format="bshd"), **kw)
    outside = _forward(q, k, v, recipe, dict(qkv_format="bshd"), q_fp8=q_fp8, **kw)
    assert torch.equal(inside[0], outside[0]) and torch.equal(inside[1], outside[1])


LAUNCH_CONFIGS = (
    (64, 4, 3, None),
    (64, 4, 2, 168),
    (64, 4, 4, None),
    (128, 4, 3, None),
    (128, 8, 2, None),
    (128, 8, 3, None),
)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("leaky", [False, True])
def test_launch_config_changes_no_output_bit(recipe, leaky):
    """block_m / num_warps / num_stages are launch parameters: the same bits for every one."""
    gen = torch.Generator().manual_seed(8)
    q, k, v = (_outlier_rows(gen, (2, 333, 4, 128), torch.bfloat16).cuda() for _ in range(3))
    seqs = sequences(q, k, "bshd", "causal", None, None, None, None, None)
    k_fp8 = attention._quantize_k(k, "bshd", recipe, False, 0.0)
    v_fp8 = attention._quantize_v(v, "bshd", seqs, recipe, False, 0.0)
    outs = [
        attention._launch(
            q, None, k_fp8, v_fp8, v, seqs, "bshd", recipe, "causal", None, 128**-0.5,
            False, 0.0, leaky, launch_config=config,
        )  # fmt: skip
        for config in LAUNCH_CONFIGS
    ]
    for out, lse in outs[1:]:
        assert torch.equal(out, outs[0][0]) and torch.equal(lse, outs[0][1])


@triton.jit
def _decode_kernel(CODES, OUT, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(OUT + offs, e8m0_to_fp32(tl.load(CODES + offs)))


def test_e8m0_decode_is_exact_on_the_gpu():
    """All 256 codes, 0 (2^-127, subnormal) and 255 (NaN) included (Triton 3.6's dot_scaled
    emulation mis-decodes those two; this kernel applies the scales itself)."""
    codes = torch.arange(256, dtype=torch.uint8, device="cuda")
    out = torch.empty(256, device="cuda")
    _decode_kernel[(1,)](codes, out, N=256)
    want = formats.e8m0_to_float(codes.cpu())
    assert torch.equal(out.cpu().view(torch.int32)[:255], want.view(torch.int32)[:255])
    assert torch.isnan(out[255])


# -------------------------------------------------------------------- accuracy


ACCURACY_CASES = [
    dict(qkv_format="bshd", attn_mask_type="causal"),
    dict(qkv_format="sbhd", attn_mask_type="causal"),
    dict(qkv_format="bshd", attn_mask_type="causal_bottom_right", s_q=150),
    dict(qkv_format="bshd", attn_mask_type="causal_bottom_right", s_kv=150),  # empty rows
    dict(qkv_format="bshd", attn_mask_type="no_mask"),
    dict(qkv_format="bshd", attn_mask_type="no_mask", window_size=(100, 90)),
    dict(qkv_format="bshd", attn_mask_type="causal", window_size=(150, 0)),
    dict(qkv_format="bshd", attn_mask_type="padding_causal", seqlens_q=[300, 77]),
    dict(qkv_format="bshd", attn_mask_type="padding", seqlens_q=[150, 3], seqlens_kv=[290, 64]),
    dict(qkv_format="thd", attn_mask_type="padding_causal", seqlens_q=[130, 1, 269]),
    dict(
        qkv_format="thd",
        attn_mask_type="padding_causal_bottom_right",
        seqlens_q=[100, 60],
        seqlens_kv=[200, 260],
    ),
]


def _accuracy_inputs(case, gen, h, h_kv, d, dtype):
    case = dict(case)
    s_q, s_kv = case.pop("s_q", 300), case.pop("s_kv", 300)
    if case["qkv_format"] == "thd":
        lens_q = case.pop("seqlens_q")
        lens_kv = case.pop("seqlens_kv", lens_q)
        case["cu_seqlens_q"] = torch.tensor([0] + lens_q).cumsum(0).int()
        case["cu_seqlens_kv"] = torch.tensor([0] + lens_kv).cumsum(0).int()
        shape_q, shape_kv = (sum(lens_q), h, d), (sum(lens_kv), h_kv, d)
    else:
        if "seqlens_q" in case:
            case.setdefault("seqlens_kv", case["seqlens_q"])
        b = 2
        shape_q = (b, s_q, h, d) if case["qkv_format"] == "bshd" else (s_q, b, h, d)
        shape_kv = (b, s_kv, h_kv, d) if case["qkv_format"] == "bshd" else (s_kv, b, h_kv, d)
    q = _outlier_rows(gen, shape_q, dtype)
    k, v = (_outlier_rows(gen, shape_kv, dtype) for _ in range(2))
    return q, k, v, case


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("case", ACCURACY_CASES, ids=lambda c: "-".join(str(x) for x in c.values()))
@pytest.mark.parametrize("h,h_kv,d,dtype", [(4, 2, 128, torch.bfloat16), (4, 1, 64, torch.float16)])
def test_accuracy_against_fp64(recipe, case, h, h_kv, d, dtype):
    """Relative Frobenius error vs the unquantized fp64 reference, next to the error of the
    fork's reference rules on the same inputs (fp64 math, P cast with the global row max). The
    kernel casts P against the running max and accumulates in fp32, so its error is of the same
    size but not equal: allow 1.5x the reference's error plus one output ulp (2^-8 bf16). The
    rules' own error is large here (1% x50 outliers: E4M3 Q.K^T dominates, ~0.1 relative), so
    the test pins the kernel to the rules, not to an absolute bound."""
    gen = torch.Generator().manual_seed(9)
    q, k, v, case = _accuracy_inputs(case, gen, h, h_kv, d, dtype)
    out, lse = _forward(q, k, v, recipe, case)
    truth = reference_attention("bf16", q, k, v, **case)
    fork = reference_attention("fork-" + recipe, q, k, v, **case)
    err = rel_frobenius_error(out.cpu(), truth.out)
    ref_err = rel_frobenius_error(fork.out, truth.out)
    empty = ~torch.isfinite(fork.lse).T  # [t, h]: padding rows and rows that see nothing
    assert not to_tokens(out.cpu(), case["qkv_format"])[empty].any()
    assert err <= 1.5 * ref_err + 2.0**-8, f"error {err:.3e} vs the reference rules' {ref_err:.3e}"
    # Hopper's FP8 MMA adds each group of 32 products at reduced precision after aligning it to
    # its largest product; with x50 outliers that product dominates, and the scores (so the LSE)
    # carry errors up to ~2^-10 relative to them (the fp64 reference has none): allow 2^-8.
    finite = torch.isfinite(truth.lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    torch.testing.assert_close(
        lse.cpu()[finite].double(), fork.lse[finite], rtol=2.0**-8, atol=2.0**-6
    )


@pytest.mark.parametrize("recipe", RECIPES)
def test_accuracy_of_long_rows_with_a_common_v_offset(recipe):
    """Note [Two-level P.V accumulation]: with V ~ N(4, 1) every tile adds the same sign to the
    running numerator; a kernel that kept it in an FP8 MMA's accumulator lost 4e-2 relative at
    s = 4k (the sm90 CUDA kernel until 2026-12-04). This kernel adds each tile's fresh product in
    fp32. Bound as test_accuracy_against_fp64 (1.5x the rules' own fp64 error + 2^-8), here
    with 32 KV tiles per row and the rules' own error ~3e-3."""
    gen = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(1, 4096, 2, 128, generator=gen) for _ in range(3))
    q, k, v = q.bfloat16(), k.bfloat16(), (v + 4.0).bfloat16()
    case = dict(qkv_format="bshd", attn_mask_type="causal")
    out, _ = _forward(q, k, v, recipe, case)
    truth = reference_attention("bf16", q, k, v, **case)
    fork = reference_attention("fork-" + recipe, q, k, v, **case)
    err = rel_frobenius_error(out.cpu(), truth.out)
    ref_err = rel_frobenius_error(fork.out, truth.out)
    assert err <= 1.5 * ref_err + 2.0**-8, f"error {err:.3e} vs the reference rules' {ref_err:.3e}"


def test_mxfp8_code_zero_blocks_decode_exactly():
    """A V channel of tiny values (E8M0 code 0 = 2^-127 in every chunk) and uniform attention
    (q = k = 0, so P = P_SCALE exactly and every sum is exact): every output of that channel is
    the tiny value itself, on FP8 and boundary tiles alike, bit for bit as the reference."""
    s, tiny = 256, 2.0**-130
    q = torch.zeros(1, s, 1, 128, dtype=torch.bfloat16)
    v = torch.ones(1, s, 1, 128, dtype=torch.bfloat16)
    v[..., 0] = tiny
    ref = reference_attention("fork-mxfp8", q, q, v, attn_mask_type="causal")
    assert ref.fp8_tiles[0].any()
    out, _ = _forward(q, q, v, "mxfp8", dict(attn_mask_type="causal"))
    assert torch.equal(out.cpu(), ref.out)
    assert (out[..., 0] == tiny).all()


@pytest.mark.parametrize("d", [32, 96, 256])
def test_unsupported_head_dim_raises(d):
    q = torch.zeros(1, 64, 2, d, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="head dims"):
        exact_fp8_attention_forward(q, q, q, recipe="current")


# (qkv_format, attn_mask_type, real lengths of the 2 samples of 200 tokens or None)
CUDA_GRAPH_CASES = [
    ("bshd", "causal", None),
    ("sbhd", "padding_causal", (200, 77)),
    ("bshd", "padding", (13, 200)),
]


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("case", CUDA_GRAPH_CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_cuda_graph_replay_equals_eager(recipe, case):
    """A captured forward, replayed on new inputs, gives the eager call's bits (out and LSE)."""
    qkv_format, mask, lens = case
    shape = (2, 200, 4, 128) if qkv_format == "bshd" else (200, 2, 4, 128)
    gen = torch.Generator(device="cuda").manual_seed(11)

    def rand():
        return torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)

    kwargs = dict(recipe=recipe, qkv_format=qkv_format, attn_mask_type=mask)
    if lens is not None:
        cu = torch.tensor([0, lens[0], lens[0] + lens[1]], dtype=torch.int32, device="cuda")
        kwargs.update(cu_seqlens_q=cu, cu_seqlens_kv=cu)
    static = [rand() for _ in range(3)]
    exact_fp8_attention_forward(*static, **kwargs)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = exact_fp8_attention_forward(*static, **kwargs)
    for _ in range(2):
        fresh = [rand() for _ in range(3)]
        for buffer, x in zip(static, fresh):
            buffer.copy_(x)
        graph.replay()
        want_out, want_lse = exact_fp8_attention_forward(*fresh, **kwargs)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


# (real lengths, padded allocations or None) of the 3 sequences of a 400-token thd pack, the
# capture's first; later replays take other cu_seqlens contents (real lengths <= MAX_SEQLEN_Q)
THD_GRAPH_PACKS = [
    ([130, 1, 169], None),
    ([200, 0, 77], None),
    ([130, 1, 169], [137, 65, 198]),
    ([7, 190, 100], [40, 250, 110]),
]
MAX_SEQLEN_Q = 200


def _thd_offsets(lens, pads):
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).int()
    cu_pad = None if pads is None else torch.tensor([0] + pads, device="cuda").cumsum(0).int()
    return cu, cu_pad


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_cuda_graph_thd_replay_equals_eager(recipe, padded):
    """thd under capture: the host never reads the offsets, so one graph serves packs of other
    lengths. Each replay (new q, k, v and new cu_seqlens contents) gives the eager call's bits
    on every row of a sequence (rows past the last sequence belong to none and are not written)."""
    t, h, h_kv, d = 400, 4, 2, 128
    gen = torch.Generator(device="cuda").manual_seed(12)
    packs = [p for p in THD_GRAPH_PACKS if (p[1] is not None) == padded]

    def rand(heads):
        return torch.randn(t, heads, d, generator=gen, device="cuda", dtype=torch.bfloat16)

    static = [rand(h), rand(h_kv), rand(h_kv)]
    cu, cu_pad = _thd_offsets(*packs[0])
    offsets = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu.clone())
    if padded:
        offsets.update(cu_seqlens_q_padded=cu_pad, cu_seqlens_kv_padded=cu_pad.clone())
    kwargs = dict(
        recipe=recipe, qkv_format="thd", attn_mask_type="padding_causal",
        max_seqlen_q=MAX_SEQLEN_Q,
    )  # fmt: skip
    exact_fp8_attention_forward(*static, **offsets, **kwargs)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = exact_fp8_attention_forward(*static, **offsets, **kwargs)
    for lens, pads in packs + packs[:1]:
        cu, cu_pad = _thd_offsets(lens, pads)
        fresh = [rand(h), rand(h_kv), rand(h_kv)]
        for buffer, x in zip(static, fresh):
            buffer.copy_(x)
        new_offsets = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu)
        if padded:
            new_offsets.update(cu_seqlens_q_padded=cu_pad, cu_seqlens_kv_padded=cu_pad)
        for name, x in new_offsets.items():
            offsets[name].copy_(x)
        graph.replay()
        want_out, want_lse = exact_fp8_attention_forward(*fresh, **new_offsets, **kwargs)
        end = int((cu if cu_pad is None else cu_pad)[-1])
        assert torch.equal(out[:end], want_out[:end]) and torch.equal(
            lse[:, :end], want_lse[:, :end]
        )


@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # the call raises before a launch
def test_cuda_graph_capture_of_thd_needs_max_seqlen_q():
    x = torch.randn(64, 2, 128, dtype=torch.bfloat16, device="cuda")
    cu = torch.tensor([0, 30, 64], dtype=torch.int32, device="cuda")
    kwargs = dict(recipe="current", qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu)
    exact_fp8_attention_forward(x, x, x, **kwargs)
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match="max_seqlen_q"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            exact_fp8_attention_forward(x, x, x, **kwargs)


# -------------------------------------------------------------------- V scale in the rescale


def _chunk_magnitudes(gen, exponents, dtype=torch.bfloat16):
    """bshd [1, 128 * len(exponents), 1, 128] V: 128-token chunk c is N(0, 1) * 2^exponents[c]."""
    scale = (2.0 ** torch.tensor(exponents, dtype=torch.float64)).repeat_interleave(128)
    v = torch.randn(1, scale.numel(), 1, 128, generator=gen, dtype=torch.float64)
    return (v * scale[None, :, None, None]).to(dtype)


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("exponents", [(-12, 10, -6, 4), (60, 100, 40, -20)], ids=["mid", "large"])
def test_v_scale_fold_across_chunk_magnitudes(exponents, pow2):
    """Note [V scale in the rescale]: V chunks far apart in magnitude (large finite values up to
    2^100 included), uniform attention (q = 0: P = P_SCALE exactly). Each 128-row block matches
    the reference to bf16 rounding, relative to its own magnitude; the outputs are finite."""
    gen = torch.Generator().manual_seed(12)
    v = _chunk_magnitudes(gen, exponents)
    k = torch.randn(v.shape, generator=gen).bfloat16()
    q = torch.zeros(1, v.shape[1], 2, 128, dtype=torch.bfloat16)
    case = dict(qkv_format="bshd", attn_mask_type="causal")
    out, _ = _forward(q, k, v, "current", case, use_power_2_scales=pow2)
    quant = QuantConfig(use_power_2_scales=pow2)
    ref = reference_attention("fork-current", q, k, v, quant=quant, **case)
    assert ref.fp8_tiles[0].sum() == 6 and torch.isfinite(out).all()
    for rows in range(0, v.shape[1], 128):
        block = slice(rows, rows + 128)
        err = rel_frobenius_error(out.cpu()[:, block].double(), ref.out[:, block].double())
        assert err < 2.0**-8, f"rows {rows}..: relative error {err:.2e}"


def test_large_finite_future_v_changes_no_earlier_row():
    """A future chunk's V scaled up to 2^100 (finite in bf16), random Q and K: rows before it
    keep every bit, whatever its scale does to the accumulator's units there."""
    gen = torch.Generator().manual_seed(13)
    v = _chunk_magnitudes(gen, (0, 20, -10, 0))
    q, k = (torch.randn(1, v.shape[1], 2, 128, generator=gen).bfloat16() for _ in range(2))
    k = k[:, :, :1]
    v2 = v.clone()
    v2[:, 384:] = (v2[:, 384:].double() * 2.0**100).bfloat16()
    case = dict(qkv_format="bshd", attn_mask_type="causal")
    base, base_lse = _forward(q, k, v, "current", case)
    pert, pert_lse = _forward(q, k, v2, "current", case)
    assert torch.equal(base[:, :384], pert[:, :384])
    assert torch.equal(base_lse[:, :384], pert_lse[:, :384])
    assert not torch.equal(base[:, 384:], pert[:, 384:])


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("scale", list(HUGE_ROW_SCALES), ids=list(HUGE_ROW_SCALES.values()))
def test_huge_scores_one_hot_rows_give_exactly_v(recipe, scale):
    """Rows whose scores reach 2^10 .. 2^33 in log2 units (testing.one_hot_self_scores: Q = K,
    the softmax one-hot on the diagonal): the output is exactly V and the LSE finite. The
    one-FMA exponent alone gave P8 of the max off 256 from ~2^20, saturated from 2^23, NaN beyond
    ~2^31; huge rows (attention_kernel._huge_row) subtract the max in the score domain."""
    qk, v = one_hot_self_scores(11, 2, 300, 4, 128, scale)
    out, lse = _forward(qk, qk, v, recipe, dict(qkv_format="bshd", attn_mask_type="causal"))
    assert torch.equal(out.cpu(), v)
    assert torch.isfinite(lse).all()


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("t", [100, 135, 200])
def test_huge_future_rows_change_no_earlier_bit(recipe, t):
    """Rows after t with scores of ~2^33 (huge rows) next to rows of ~2^10: no bit of rows <= t
    changes against a run where every row is of ~2^10 (the huge-row decision is each row's own)."""
    qk, v = one_hot_self_scores(12, 2, 300, 4, 128, 8.0)
    kw = dict(qkv_format="bshd", attn_mask_type="causal")
    base_out, base_lse = _forward(qk, qk, v, recipe, kw)
    qk2 = qk.clone()
    qk2[:, t + 1 :] *= 23170.0 / 8.0
    out, lse = _forward(qk2, qk2, v, recipe, kw)
    assert torch.equal(out[:, : t + 1], base_out[:, : t + 1])
    rows = torch.arange(300, device=lse.device).repeat(2) <= t  # [b * s] token-major
    assert torch.equal(lse[:, rows], base_lse[:, rows])
