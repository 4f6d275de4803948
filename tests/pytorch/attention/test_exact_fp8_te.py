"""Mask-exact FP8 attention through Transformer Engine's modules (GPU, upstream TE + the fork).

Run by tools/gpu_te_check.sh on a GPU machine where upstream TE 2.20.2 is installed and the fork's
assembled tree comes first on PYTHONPATH. Covers DotProductAttention, MultiheadAttention and
TransformerLayer: the bug report's repro (DESIGN.md section 7) with upstream's leak as the negative
control, randomized bitwise invariance, gradients against fp64, refused requests and fallbacks.

MXFP8 on GPUs below sm100: upstream's autocast refuses MXFP8BlockScaling there, so attention gets
MXFP8 through NVTE_DPA_FP8_RECIPE=MXFP8BlockScaling under a Float8CurrentScaling autocast (the
switch builds an MXFP8 recipe for attention only; patch 0002 carries the field into it). The
tests set the switch by patching the module globals that TE reads from that variable at import.
"""

import dataclasses
import logging
from typing import List, Optional, Tuple

import pytest
import torch

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import (
    SeqLayout,
    to_tokens,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.attention import (
    reference_attention,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
    prefix_change,
    rel_frobenius_error,
)

try:
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe as te_recipes
    from transformer_engine.pytorch.attention import multi_head_attention as mha_module
    from transformer_engine.pytorch.attention.dot_product_attention import (
        dot_product_attention as dpa_module,
    )
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import (
        kernels as kernel_module,
    )

    _TE_MISSING = None if hasattr(dpa_module, "exact_fp8_backend") else "TE without the fork"
except Exception as error:  # pylint: disable=broad-exception-caught
    _TE_MISSING = f"{type(error).__name__}: {error}"

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        _TE_MISSING is not None,
        reason="needs transformer_engine.pytorch from the assembled fork over upstream TE"
        f" (tools/gpu_te_check.sh): {_TE_MISSING}",
    ),
]

GRAD_RTOL = 0.08
"""Relative Frobenius error allowed for dq, dk, dv of mask-exact FP8 attention against fp64.

Reasoning: E4M3 keeps 3 mantissa bits (unit roundoff 2^-4), so the per-token Q/K quantization
perturbs every logit by a few percent (the forward output is off by 3.4-3.7% for random inputs,
tests/cpu/reference/test_reference_attention.py). The backward computes the gradients of the attention of
the quantized Q and K (Note [Backward of the FP8 forward] in exact_fp8/te/autograd.py), which
differ from the unquantized gradients by the same order: the reference backward (fp64) on the
reference rules stays below 0.06 (tests/cpu/te/test_dispatch.py); the BF16 rounding of P, dS and
the dequantized Q, K in the kernels adds well under 0.01 (unit roundoff 2^-9). 0.08 leaves a
margin for kernel-level
differences. An error of this order is what an FP8 forward costs; a broken backward (wrong softmax
statistics, a layout mix-up) gives errors of order 1.
"""

BF16_GRAD_RTOL = 0.02
"""Upstream's BF16 attention gradients against fp64 (a sanity bound for the comparison itself)."""

E4M3 = None if _TE_MISSING else te_recipes.Format.E4M3


@pytest.fixture(autouse=True)
def _deterministic(monkeypatch):
    """DESIGN.md section 7 runs with NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 (read by DPA's __init__)."""
    monkeypatch.setenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")


def _current(field=True):
    return te_recipes.Float8CurrentScaling(
        fp8_format=E4M3, fp8_dpa=True, fp8_mha=False, fp8_dpa_mask_exact=field
    )


def _set_dpa_switch(monkeypatch, value):
    """NVTE_DPA_FP8_RECIPE=value, as DotProductAttention and MultiheadAttention read it at import."""
    monkeypatch.setattr(dpa_module, "_dpa_fp8_recipe", value)
    monkeypatch.setattr(mha_module, "_dpa_fp8_recipe", value)


def _native_mxfp8() -> bool:
    return torch.cuda.get_device_capability() >= (10, 0)


@pytest.fixture
def recipe_for(monkeypatch):
    """recipe_for(kind, field): an autocast recipe whose DotProductAttention runs `kind` FP8."""

    def make(kind, field=True):
        if kind == "current":
            return _current(field)
        if _native_mxfp8():
            return te_recipes.MXFP8BlockScaling(
                fp8_format=E4M3, fp8_dpa=True, fp8_mha=False, fp8_dpa_mask_exact=field
            )
        _set_dpa_switch(monkeypatch, "MXFP8BlockScaling")
        return _current(field)

    return make


def _rand(*shape, gen, scale=1.0):
    return (torch.randn(*shape, generator=gen, device="cuda") * scale).bfloat16()


# ---------------------------------------------------------------------------------------------
# The bug report's repro (DESIGN.md section 7)

REPORT_ROWS = 8  # outputs compared through t = 7
REPORT_CASES = {
    # name: (recipe kind, V[0, 0], future position, future value, upstream (max_abs, changed))
    "mx-same-block": ("mxfp8", 2.0**-20, 16, 1.0, (9.5367431641e-07, 8)),
    "mx-next-block": ("mxfp8", 2.0**-20, 32, 1.0, (0.0, 0)),
    "current-future": ("current", 2.0**-10, 64, 1024.0, (9.7656250000e-04, 8)),
}


def _report_outputs(recipe, v0, position, value):
    """Base and perturbed outputs [128, 1, 128] of the report's DotProductAttention call."""
    dpa = te.DotProductAttention(
        num_attention_heads=1,
        kv_channels=128,
        attention_dropout=0.0,
        qkv_format="sbhd",
        attn_mask_type="causal",
    ).eval()
    q = k = torch.ones(128, 1, 1, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.zeros_like(q)
    v[0, 0, 0, 0] = v0
    v_future = v.clone()
    v_future[position, 0, 0, 0] = value
    with torch.no_grad(), te.autocast(enabled=recipe is not None, recipe=recipe):
        return dpa(q, k, v).view(128, 1, 128), dpa(q, k, v_future).view(128, 1, 128)


def _report_change(recipe, case):
    _, v0, position, value, _ = REPORT_CASES[case]
    base, perturbed = _report_outputs(recipe, v0, position, value)
    return base, prefix_change(base, perturbed, torch.arange(128, device="cuda") < REPORT_ROWS)


@pytest.mark.parametrize("case", sorted(REPORT_CASES))
def test_report_fork_changes_nothing(case, recipe_for, kernel_runs):
    kind, v0 = REPORT_CASES[case][:2]
    base, change = _report_change(recipe_for(kind), case)
    assert change == (0.0, 0)
    assert kernel_runs == [kind, kind]
    assert base[7, 0, 0].item() == v0 / 8  # the exact causal mean of V[0..7, 0]


@pytest.mark.parametrize("case", sorted(REPORT_CASES))
def test_report_bf16_control_changes_nothing(case, kernel_runs):
    _, change = _report_change(None, case)
    assert change == (0.0, 0) and kernel_runs == []


def test_report_upstream_current_scaling_leaks(monkeypatch, kernel_runs):
    """Negative control: the field off gives upstream's FP8 attention, which leaks (run through
    upstream's unfused FP8 emulation: fused current-scaling FP8 attention needs sm100)."""
    monkeypatch.setenv("NVTE_UnfusedDPA_Emulate_FP8", "1")
    _, change = _report_change(_current(field=False), "current-future")
    assert change == REPORT_CASES["current-future"][4]
    assert kernel_runs == []


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_capability() < (10, 0),
    reason="upstream's MXFP8 attention needs sm100 (Blackwell); not run on this GPU",
)
@pytest.mark.parametrize("case", ["mx-same-block", "mx-next-block"])
def test_report_upstream_mxfp8_leaks(case, recipe_for, kernel_runs):
    _, change = _report_change(recipe_for("mxfp8", field=False), case)
    assert change == REPORT_CASES[case][4]
    assert kernel_runs == []


# ---------------------------------------------------------------------------------------------
# Randomized invariance through DotProductAttention


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A DotProductAttention call and a perturbation that must not change the protected rows.

    kind: "future" (positions after the middle of each sequence, relative to its diagonal),
    "other" (every token of sequence 1), "padding" (padding tokens and thd gaps), "window"
    (positions left of the sliding window of the last 84 rows).
    """

    name: str
    qkv_format: str
    mask: str
    kind: str
    lens_q: Tuple[int, ...]
    lens_kv: Tuple[int, ...]
    span_q: int = 0  # bshd/sbhd sequence length (0: max of lens)
    span_kv: int = 0
    gaps: Tuple[int, ...] = ()  # thd: padding tokens after each sequence
    window: Optional[Tuple[int, int]] = None
    heads: Tuple[int, int] = (4, 2)
    head_dim: int = 128

    def layouts(self) -> Tuple[SeqLayout, SeqLayout]:
        if self.qkv_format == "thd":
            gaps = self.gaps or (0,) * len(self.lens_q)
            return _varlen(self.lens_q, gaps), _varlen(self.lens_kv, gaps)
        span_q = self.span_q or max(self.lens_q)
        span_kv = self.span_kv or max(self.lens_kv)
        return (
            SeqLayout.dense(len(self.lens_q), span_q, self.lens_q),
            SeqLayout.dense(len(self.lens_kv), span_kv, self.lens_kv),
        )


def _varlen(lens, gaps):
    return SeqLayout.varlen(_cu(lens), _cu([n + g for n, g in zip(lens, gaps)]))


def _cu(lens, device="cpu"):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


SCENARIOS = [
    Scenario("bshd-causal-future", "bshd", "causal", "future", (384, 384), (384, 384)),
    Scenario("sbhd-mqa-future", "sbhd", "causal", "future", (320,) * 2, (320,) * 2, heads=(8, 1)),
    Scenario("bshd-d64-future", "bshd", "causal", "future", (384,), (384,), head_dim=64),
    Scenario(
        "bshd-bottom-right-future", "bshd", "causal_bottom_right", "future", (256,) * 2, (384,) * 2
    ),
    Scenario("bshd-window", "bshd", "causal", "window", (384,), (384,), window=(64, 0)),
    Scenario("bshd-no-mask-other-sample", "bshd", "no_mask", "other", (256,) * 3, (256,) * 3),
    Scenario("bshd-padding", "bshd", "padding_causal", "padding", (300, 384), (300, 384)),
    Scenario(
        "thd-other-sequence-gaps",
        "thd",
        "padding_causal",
        "other",
        (200, 250, 150),
        (200, 250, 150),
        gaps=(8, 0, 24),
    ),
    Scenario(
        "thd-gap-garbage", "thd", "padding_causal", "padding", (200, 250), (200, 250), gaps=(40, 9)
    ),
    Scenario("thd-future", "thd", "padding_causal", "future", (300, 130, 257), (300, 130, 257)),
]


def _perturbation(scenario: Scenario):
    """(protected q tokens, perturbed q tokens, perturbed kv tokens), bool over the token axes."""
    layout_q, layout_kv = scenario.layouts()
    keep = torch.zeros(layout_q.total, dtype=torch.bool)
    bad_q = torch.zeros(layout_q.total, dtype=torch.bool)
    bad_kv = torch.zeros(layout_kv.total, dtype=torch.bool)
    top_left = scenario.mask in ("causal", "padding_causal")
    for n in range(layout_q.num_seqs):
        len_q, len_kv = layout_q.lens[n], layout_kv.lens[n]
        i = torch.arange(layout_q.spans[n])
        j = torch.arange(layout_kv.spans[n])
        real = i < len_q
        if scenario.kind == "future":
            cut = len_q // 2
            offset = 0 if top_left else len_kv - len_q
            rows, q_sel, kv_sel = real & (i <= cut), i > cut, j > cut + offset
        elif scenario.kind == "other":
            victim = torch.full_like(i, n == 1, dtype=torch.bool)
            rows, q_sel, kv_sel = (
                real & ~victim,
                victim,
                torch.full_like(j, n == 1, dtype=torch.bool),
            )
        elif scenario.kind == "padding":
            rows, q_sel, kv_sel = real, ~real, j >= len_kv
        else:  # "window": rows >= cut never see positions < cut - left
            cut = len_q - 84
            rows, q_sel, kv_sel = real & (i >= cut), i < cut, j < cut - scenario.window[0]
        keep[layout_q.starts[n] : layout_q.starts[n] + layout_q.spans[n]] = rows
        bad_q[layout_q.starts[n] : layout_q.starts[n] + layout_q.spans[n]] = q_sel
        bad_kv[layout_kv.starts[n] : layout_kv.starts[n] + layout_kv.spans[n]] = kv_sel
    return keep.cuda(), bad_q.cuda(), bad_kv.cuda()


def _from_tokens(x, scenario: Scenario, batch: int):
    """Token-major [t, h, d] ((b, s) order) -> the scenario's format."""
    if scenario.qkv_format == "thd":
        return x.contiguous()
    x = x.view(batch, -1, *x.shape[1:])
    return x.contiguous() if scenario.qkv_format == "bshd" else x.transpose(0, 1).contiguous()


def _garbage(like, gen):
    """Large values with outliers: they move every amax they are reduced into."""
    x = torch.randn(like.shape, generator=gen, device="cuda") * 64
    x[torch.rand(like.shape, generator=gen, device="cuda") < 0.01] = 30000.0
    return x.bfloat16()


def _scenario_outputs(scenario: Scenario, recipe, seed=0):
    """(base tokens, perturbed tokens, protected rows): DPA outputs as [t_q, h, d]."""
    h, h_kv = scenario.heads
    d = scenario.head_dim
    layout_q, layout_kv = scenario.layouts()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = _rand(layout_q.total, h, d, gen=gen)
    k = _rand(layout_kv.total, h_kv, d, gen=gen)
    v = _rand(layout_kv.total, h_kv, d, gen=gen)
    keep, bad_q, bad_kv = _perturbation(scenario)
    perturbed = [
        torch.where(sel[:, None, None], _garbage(x, gen), x)
        for x, sel in ((q, bad_q), (k, bad_kv), (v, bad_kv))
    ]
    dpa = te.DotProductAttention(
        h,
        d,
        num_gqa_groups=h_kv,
        attention_dropout=0.0,
        qkv_format=scenario.qkv_format,
        attn_mask_type=scenario.mask,
        window_size=scenario.window,
    ).eval()
    kwargs = _seqlen_kwargs(scenario)
    batch = layout_q.num_seqs
    outs = []
    with torch.no_grad(), te.autocast(enabled=recipe is not None, recipe=recipe):
        for tensors in ((q, k, v), perturbed):
            out = dpa(*(_from_tokens(x, scenario, batch) for x in tensors), **kwargs)
            outs.append(to_tokens(out.view(*out.shape[:-1], h, d), scenario.qkv_format))
    return outs[0], outs[1], keep


def _seqlen_kwargs(scenario: Scenario):
    if scenario.qkv_format == "thd":
        layout_q, layout_kv = scenario.layouts()
        padded = lambda layout: torch.tensor(
            list(layout.starts) + [layout.total], dtype=torch.int32, device="cuda"
        )
        return dict(
            cu_seqlens_q=_cu(scenario.lens_q, "cuda"),
            cu_seqlens_kv=_cu(scenario.lens_kv, "cuda"),
            cu_seqlens_q_padded=padded(layout_q),
            cu_seqlens_kv_padded=padded(layout_kv),
            max_seqlen_q=max(layout_q.spans),
            max_seqlen_kv=max(layout_kv.spans),
        )
    if "padding" in scenario.mask:
        return dict(
            cu_seqlens_q=_cu(scenario.lens_q, "cuda"), cu_seqlens_kv=_cu(scenario.lens_kv, "cuda")
        )
    return {}


@pytest.mark.parametrize("kind", ["current", "mxfp8"])
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_dpa_invariance(scenario, kind, recipe_for, kernel_runs):
    base, perturbed, keep = _scenario_outputs(scenario, recipe_for(kind))
    assert kernel_runs == [kind, kind]
    assert keep.any() and torch.isfinite(base[keep]).all()
    assert torch.equal(base[keep], perturbed[keep])


def test_dpa_invariance_negative_control(monkeypatch, kernel_runs):
    """The same check catches upstream's current-scaling FP8 attention (field off, emulated)."""
    monkeypatch.setenv("NVTE_UnfusedDPA_Emulate_FP8", "1")
    base, perturbed, keep = _scenario_outputs(SCENARIOS[0], _current(field=False))
    assert kernel_runs == []
    assert prefix_change(base, perturbed, keep)[1] > 0


@pytest.mark.parametrize("qkv_format", ["bshd", "sbhd", "thd"])
def test_packed_layouts_match_separate_tensors(qkv_format, kernel_runs):
    """qkv_layer / kv_layer (bs3hd, sb3hd, t3hd and the 2-packed kv) give the same bits."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    h, d, batch, s = 4, 128, 2, 256
    shape = {"bshd": (batch, s), "sbhd": (s, batch), "thd": (batch * s,)}[qkv_format]
    qkv = _rand(*shape, 3, h, d, gen=gen)
    mask = "padding_causal" if qkv_format == "thd" else "causal"
    kwargs = {}
    if qkv_format == "thd":
        cu = _cu([s] * batch, "cuda")
        kwargs = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=s, max_seqlen_kv=s)
    dpa = te.DotProductAttention(h, d, qkv_format=qkv_format, attn_mask_type=mask).eval()
    q, k, v = qkv.unbind(-3)
    with torch.no_grad(), te.autocast(enabled=True, recipe=_current()):
        separate = dpa(q.contiguous(), k.contiguous(), v.contiguous(), **kwargs)
        packed = dpa(qkv_layer=qkv, **kwargs)
        kv_packed = dpa(q.contiguous(), kv_layer=qkv[..., 1:, :, :].contiguous(), **kwargs)
    assert len(kernel_runs) == 3
    assert torch.equal(separate, packed) and torch.equal(separate, kv_packed)


# ---------------------------------------------------------------------------------------------
# Gradients


def _fp64_grads(q, k, v, d_out, **kwargs):
    leaves = [x.detach().cpu().double().requires_grad_() for x in (q, k, v)]
    out = reference_attention("bf16", *leaves, compute_dtype=torch.float64, **kwargs).out
    return torch.autograd.grad(out, leaves, d_out.detach().cpu().double())


def _dpa_grads(qkv_format, recipe, seed=0):
    """(fork or BF16 grads, fp64 grads) of a GQA causal DotProductAttention call."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    h, h_kv, d, batch, s = 4, 2, 128, 2, 512
    lead = {"bshd": (batch, s), "sbhd": (s, batch), "thd": (batch * s,)}[qkv_format]
    q = _rand(*lead, h, d, gen=gen).requires_grad_()
    k = _rand(*lead, h_kv, d, gen=gen).requires_grad_()
    v = _rand(*lead, h_kv, d, gen=gen).requires_grad_()
    d_out = _rand(*lead, h * d, gen=gen)
    mask = "padding_causal" if qkv_format == "thd" else "causal"
    kwargs, ref_kwargs = {}, {}
    if qkv_format == "thd":
        cu = _cu([s] * batch, "cuda")
        kwargs = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=s, max_seqlen_kv=s)
        ref_kwargs = dict(cu_seqlens_q=cu.cpu(), cu_seqlens_kv=cu.cpu())
    dpa = te.DotProductAttention(
        h, d, num_gqa_groups=h_kv, qkv_format=qkv_format, attn_mask_type=mask
    )
    with te.autocast(enabled=recipe is not None, recipe=recipe):
        out = dpa(q, k, v, **kwargs)
    got = [g.cpu() for g in torch.autograd.grad(out, (q, k, v), d_out)]  # the reference's device
    want = _fp64_grads(
        q, k, v, d_out.view(*lead, h, d), qkv_format=qkv_format, attn_mask_type=mask, **ref_kwargs
    )
    return got, want


@pytest.mark.parametrize(
    "qkv_format,kind",
    [("bshd", "current"), ("sbhd", "current"), ("thd", "current"), ("bshd", "mxfp8")],
)
def test_gradients_of_the_fork_backward(qkv_format, kind, recipe_for, kernel_runs, backward_runs):
    got, want = _dpa_grads(qkv_format, recipe_for(kind))
    assert kernel_runs == [kind] and backward_runs == [kind]
    errors = [rel_frobenius_error(g, w) for g, w in zip(got, want)]
    assert max(errors) < GRAD_RTOL, errors


def test_gradients_without_fused_attention(monkeypatch, kernel_runs, backward_runs):
    """NVTE_FUSED_ATTN=0 (no cuDNN attention) changes nothing: the backward is the fork's."""
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    got, want = _dpa_grads("bshd", _current())
    assert kernel_runs == ["current"] and backward_runs == ["current"]
    errors = [rel_frobenius_error(g, w) for g, w in zip(got, want)]
    assert max(errors) < GRAD_RTOL, errors


def test_gradients_bf16_reference_is_sane():
    got, want = _dpa_grads("bshd", None)
    errors = [rel_frobenius_error(g, w) for g, w in zip(got, want)]
    assert max(errors) < BF16_GRAD_RTOL, errors


def test_backward_is_deterministic():
    first, _ = _dpa_grads("bshd", _current(), seed=3)
    second, _ = _dpa_grads("bshd", _current(), seed=3)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


# ---------------------------------------------------------------------------------------------
# Requests refused, configurations that fall back


def test_fp8_mha_is_refused():
    dpa = te.DotProductAttention(2, 128, qkv_format="bshd")
    x = torch.randn(1, 128, 2, 128, dtype=torch.bfloat16, device="cuda")
    recipe = te_recipes.Float8CurrentScaling(fp8_format=E4M3, fp8_dpa=True, fp8_mha=True)
    with te.autocast(enabled=True, recipe=recipe), pytest.raises(ValueError, match="fp8_mha"):
        dpa(x, x, x)


def test_fp8_output_is_refused():
    dpa = te.DotProductAttention(2, 128, qkv_format="bshd")
    x = torch.randn(1, 128, 2, 128, dtype=torch.bfloat16, device="cuda")
    with te.autocast(enabled=True, recipe=_current()), pytest.raises(
        ValueError, match="fp8_output"
    ):
        dpa(x, x, x, fp8_output=True)


FALLBACKS = {
    # name: (DotProductAttention kwargs, forward kwargs builder, reason fragment)
    "head-dim-96": (dict(kv_channels=96), lambda b, s: {}, "head_dim_qk=96"),
    "softcap": (dict(kv_channels=128, softcap=30.0), lambda b, s: {}, "softcap"),
    "arbitrary-mask": (
        dict(kv_channels=128, attn_mask_type="arbitrary"),
        lambda b, s: dict(
            attention_mask=torch.rand(b, 1, s, s, device="cuda") < 0.3,
        ),
        "arbitrary",
    ),
}


@pytest.mark.parametrize("name", sorted(FALLBACKS))
def test_unsupported_configurations_run_bf16_with_a_logged_reason(name, caplog, kernel_runs):
    module_kwargs, forward_kwargs, fragment = FALLBACKS[name]
    d = module_kwargs["kv_channels"]
    dpa = te.DotProductAttention(2, qkv_format="bshd", **module_kwargs).eval()
    gen = torch.Generator(device="cuda").manual_seed(2)
    q, k, v = (_rand(2, 128, 2, d, gen=gen) for _ in range(3))
    forward_kwargs = forward_kwargs(2, 128)
    caplog.set_level(logging.DEBUG, logger="DotProductAttention")
    with torch.no_grad(), te.autocast(enabled=True, recipe=_current()):
        fallback = dpa(q, k, v, **forward_kwargs)
    messages = [r.getMessage() for r in caplog.records if "mask-exact" in r.getMessage()]
    assert any("Disabling mask-exact FP8 attention for" in m and fragment in m for m in messages)
    with torch.no_grad():
        bf16 = dpa(q, k, v, **forward_kwargs)
    assert kernel_runs == [] and torch.equal(fallback, bf16)


# ---------------------------------------------------------------------------------------------
# MultiheadAttention and TransformerLayer


def _module(kind, seed, fuse_qkv_params=False):
    torch.manual_seed(seed)
    common = dict(params_dtype=torch.bfloat16, num_gqa_groups=2, fuse_qkv_params=fuse_qkv_params)
    if kind == "TransformerLayer":
        layer = te.TransformerLayer(
            512,
            1024,
            4,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            self_attn_mask_type="causal",
            attn_input_format="bshd",
            **common,
        )
    else:
        layer = te.MultiheadAttention(
            512,
            4,
            attention_dropout=0.0,
            attn_mask_type="causal",
            qkv_format="bshd",
            input_layernorm=True,
            **common,
        )
    return layer.cuda()


def _delayed_scaling_linear():
    """Linear layers under DelayedScaling: their scales come from earlier steps (the initial scale
    in a fresh module's first step), so they quantize each token on its own; the attention's FP8
    recipe comes from the NVTE_DPA_FP8_RECIPE switch. Thus only the attention could leak."""
    return te_recipes.DelayedScaling(fp8_dpa=True)


def _layer_prefix_change(run_layer):
    """(max_abs, changed) of a layer's outputs at rows <= 190 when the rows after them turn to
    garbage. run_layer(x [2, 384, 512]) builds a fresh layer and returns its output."""
    gen = torch.Generator(device="cuda").manual_seed(4)
    batch, s, cut = 2, 384, 190
    x = _rand(batch, s, 512, gen=gen)
    x_future = x.clone()
    x_future[:, cut + 1 :] = _garbage(x_future[:, cut + 1 :], gen)
    outs = [run_layer(inp).view(batch * s, 1, 512) for inp in (x, x_future)]
    keep = (torch.arange(s, device="cuda") <= cut).repeat(batch)
    return prefix_change(outs[0], outs[1], keep)


def _module_prefix_change(kind, fuse_qkv_params=False, recipe=None):
    def run_layer(inp):
        layer = _module(kind, seed=5, fuse_qkv_params=fuse_qkv_params).eval()  # a fresh DS state
        with torch.no_grad(), te.autocast(enabled=True, recipe=recipe or _delayed_scaling_linear()):
            return layer(inp)

    return _layer_prefix_change(run_layer)


@pytest.mark.parametrize("switch", ["Float8CurrentScaling", "MXFP8BlockScaling"])
@pytest.mark.parametrize(
    "kind,fuse",
    [("MultiheadAttention", False), ("TransformerLayer", False), ("TransformerLayer", True)],
)
def test_module_invariance(kind, fuse, switch, monkeypatch, kernel_runs):
    _set_dpa_switch(monkeypatch, switch)
    assert _module_prefix_change(kind, fuse) == (0.0, 0)
    expected = {"Float8CurrentScaling": "current", "MXFP8BlockScaling": "mxfp8"}[switch]
    assert kernel_runs == [expected] * 2


def test_module_invariance_negative_control(monkeypatch, kernel_runs):
    """The harness above can see a leak: everything under upstream's Float8CurrentScaling (field
    off, attention emulated on sm90) changes the prefix. Its Linear layers quantize activations with
    one amax over all tokens, so this control is not attention-specific; the attention-specific
    controls are the DotProductAttention ones (test_report_upstream_*)."""
    monkeypatch.setenv("NVTE_UnfusedDPA_Emulate_FP8", "1")
    assert _module_prefix_change("TransformerLayer", recipe=_current(False))[1] > 0
    assert kernel_runs == []


def test_mha_asks_no_fp8_output(monkeypatch, kernel_runs):
    """Float8CurrentScaling with fp8_dpa: upstream's MultiheadAttention asks its attention for an
    FP8 output; with the field on it must not (the output would carry one amax over all tokens)."""
    asked: List[bool] = []
    original = te.DotProductAttention.forward

    def spy(self, *args, **kwargs):
        asked.append(kwargs.get("fp8_output"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(te.DotProductAttention, "forward", spy)
    layer = _module("MultiheadAttention", seed=0).eval()
    x = torch.randn(2, 256, 512, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad(), te.autocast(enabled=True, recipe=_current()):
        layer(x)
    assert asked == [False] and kernel_runs == ["current"]


def test_mha_fp8_mha_is_refused():
    layer = _module("MultiheadAttention", seed=0).eval()
    x = torch.randn(2, 128, 512, dtype=torch.bfloat16, device="cuda")
    recipe = te_recipes.Float8CurrentScaling(fp8_format=E4M3, fp8_dpa=True, fp8_mha=True)
    with torch.no_grad(), te.autocast(enabled=True, recipe=recipe):
        with pytest.raises(ValueError, match="fp8_mha"):
            layer(x)


@pytest.mark.parametrize("switch", ["Float8CurrentScaling", "MXFP8BlockScaling"])
def test_transformer_layer_training_step(switch, monkeypatch, kernel_runs, backward_runs):
    _set_dpa_switch(monkeypatch, switch)
    layer = _module("TransformerLayer", seed=6).train()
    x = torch.randn(2, 256, 512, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    with te.autocast(enabled=True, recipe=_delayed_scaling_linear()):
        y = layer(x)
    y.backward(torch.randn_like(y))
    assert len(kernel_runs) == 1 and backward_runs == kernel_runs
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)


# ---------------------------------------------------------------------------------------------
# CUDA graphs


@pytest.mark.parametrize("kind", ["current", "mxfp8"])
def test_cuda_graph_training_step(kind, recipe_for, kernel_runs, backward_runs):
    """make_graphed_callables captures the fork's forward and its backward: a replay gives
    the eager step's bits (output and gradients), and it stays mask-exact (future keys' values
    changed: the earlier rows' outputs keep their bits)."""
    recipe = recipe_for(kind)
    h, h_kv, d, batch, s, t = 4, 2, 128, 2, 256, 100
    gen = torch.Generator(device="cuda").manual_seed(5)

    def inputs():
        return [_rand(batch, s, n, d, gen=gen).requires_grad_() for n in (h, h_kv, h_kv)]

    dpa = te.DotProductAttention(
        h, d, num_gqa_groups=h_kv, qkv_format="bshd", attn_mask_type="causal"
    )
    graphed = te.make_graphed_callables(dpa, tuple(inputs()), enabled=True, recipe=recipe)
    assert kernel_runs and set(kernel_runs) == {kind} and set(backward_runs) == {kind}  # captured
    d_out = _rand(batch, s, h * d, gen=gen)

    def step(fn, q, k, v):
        with te.autocast(enabled=True, recipe=recipe):
            out = fn(q, k, v)
        grads = torch.autograd.grad(out, (q, k, v), d_out)
        return out.detach().clone(), [g.clone() for g in grads]  # a replay reuses its buffers

    q, k, v = inputs()
    got_out, got_grads = step(graphed, q, k, v)
    want_out, want_grads = step(dpa, q, k, v)
    assert torch.equal(got_out, want_out)
    assert all(torch.equal(g, w) for g, w in zip(got_grads, want_grads))
    v_future = v.detach().clone()
    v_future[:, t:] = _rand(batch, s - t, h_kv, d, gen=gen, scale=50.0)
    future_out, _ = step(graphed, q, k, v_future.requires_grad_())
    assert torch.equal(future_out[:, :t], got_out[:, :t])
    assert not torch.equal(future_out[:, t:], got_out[:, t:])  # the replay saw the new values


class _PackedAttention(torch.nn.Module):
    """DotProductAttention over a thd pack whose offsets are tensor inputs (what a graph can take
    as static inputs; TE's make_graphed_callables needs tensors) and max_seqlen a constant."""

    def __init__(self, dpa, max_seqlen):
        super().__init__()
        self.dpa, self.max_seqlen = dpa, max_seqlen

    def forward(self, q, k, v, cu_seqlens_q, cu_seqlens_kv):
        return self.dpa(
            q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
            max_seqlen_q=self.max_seqlen, max_seqlen_kv=self.max_seqlen,
        )  # fmt: skip


@pytest.mark.parametrize("kind", ["current", "mxfp8"])
def test_cuda_graph_thd_training_step(kind, recipe_for, kernel_runs, backward_runs):
    """thd under make_graphed_callables, the offsets static inputs of the graph: the fork's
    forward and backward are captured, and replays with other cu_seqlens contents (the same
    number of sequences, real lengths <= max_seqlen) give the eager step's bits, output and
    gradients, on every token of a sequence."""
    recipe = recipe_for(kind)
    h, h_kv, d, t = 4, 2, 128, 512
    packs = [[0, 200, 201, 456], [0, 256, 300, 512], [0, 17, 100, 356]]
    gen = torch.Generator(device="cuda").manual_seed(7)

    def inputs():
        return [_rand(t, n, d, gen=gen).requires_grad_() for n in (h, h_kv, h_kv)]

    def offsets(pack):
        cu = torch.tensor(pack, dtype=torch.int32, device="cuda")
        return dict(cu_seqlens_q=cu, cu_seqlens_kv=cu.clone())

    dpa = te.DotProductAttention(
        h, d, num_gqa_groups=h_kv, qkv_format="thd", attn_mask_type="padding_causal"
    )
    packed = _PackedAttention(dpa, max_seqlen=256)
    graphed = te.make_graphed_callables(
        packed, tuple(inputs()), sample_kwargs=offsets(packs[0]), enabled=True, recipe=recipe
    )
    assert kernel_runs and set(kernel_runs) == {kind} and set(backward_runs) == {kind}  # captured
    d_out = _rand(t, h * d, gen=gen)

    def step(fn, q, k, v, kwargs):
        with te.autocast(enabled=True, recipe=recipe):
            out = fn(q, k, v, **kwargs)
        grads = torch.autograd.grad(out, (q, k, v), d_out)
        return out.detach().clone(), [g.clone() for g in grads]  # a replay reuses its buffers

    for pack in packs[1:] + packs[:1]:
        q, k, v = inputs()
        got_out, got_grads = step(graphed, q, k, v, offsets(pack))
        want_out, want_grads = step(packed, q, k, v, offsets(pack))
        end = pack[-1]  # tokens past the last sequence belong to none
        assert torch.equal(got_out[:end], want_out[:end])
        assert all(torch.equal(g[:end], w[:end]) for g, w in zip(got_grads, want_grads))


# ---------------------------------------------------------------------------------------------
# What a user sees: exact_fp8.te.status, get_attention_backend (patch 0005), per-module recipes


def _status_module():
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.te import status

    return status


def test_status_counts_mask_exact_calls_and_fallbacks(kernel_runs):
    status = _status_module()
    status.reset()
    gen = torch.Generator(device="cuda").manual_seed(8)
    dpa = te.DotProductAttention(2, 128, qkv_format="bshd").eval()
    small = te.DotProductAttention(2, 96, qkv_format="bshd").eval()
    q, k, v = (_rand(2, 128, 2, 128, gen=gen) for _ in range(3))
    q96, k96, v96 = (_rand(2, 128, 2, 96, gen=gen) for _ in range(3))
    with torch.no_grad(), te.autocast(enabled=True, recipe=_current()):
        dpa(q, k, v)
        dpa(q, k, v)
        small(q96, k96, v96)
    s = status.status()
    assert (s.mask_exact_calls, s.last_recipe) == (2, "current")
    assert s.last_kernel_backend == kernel_module.last_backend() in kernel_module.BACKENDS
    ((reason, count),) = s.fallbacks.items()
    assert reason.startswith("head_dim_qk=96") and count == 1
    assert kernel_runs == ["current"] * 2


def test_get_attention_backend_reports_the_mask_exact_backend(monkeypatch, kernel_runs):
    """Current scaling FP8 attention on sm90: upstream's selection has no backend for it; with
    patch 0005 it reports the fork's (and BF16's selection where the fork falls back)."""
    from transformer_engine.pytorch.attention.dot_product_attention import utils as dpa_utils
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.te import selection

    captured = []
    original = dpa_module.exact_fp8_backend.dispatch

    def spy(module, params):
        captured.append(params)
        return original(module, params)

    monkeypatch.setattr(dpa_module.exact_fp8_backend, "dispatch", spy)
    gen = torch.Generator(device="cuda").manual_seed(9)
    x = _rand(2, 128, 2, 128, gen=gen)
    dpa = te.DotProductAttention(2, 128, qkv_format="bshd").eval()
    with torch.no_grad(), te.autocast(enabled=True, recipe=_current()):
        dpa(x, x, x)
    flash, _, fused, fused_backend, unfused, available = dpa_utils.get_attention_backend(
        captured[0]
    )
    assert (flash, bool(fused), unfused, available) == (False, True, False, [False, True, False])
    assert selection.is_mask_exact_backend(fused_backend)
    bf16 = dpa_utils.get_attention_backend(dataclasses.replace(captured[0], fp8=False))
    assert not selection.is_mask_exact_backend(bf16[3]) and any(bf16[5])


def _example():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "examples" / "gpt_fp8_causal.py"
    spec = importlib.util.spec_from_file_location("gpt_fp8_causal", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _nested_prefix_change(linear_recipe):
    """TransformerLayer prefix change with its Linear layers under `linear_recipe` (None: BF16)
    and its DotProductAttention under its own Float8CurrentScaling(fp8_dpa=True), as the example
    runs it (examples/gpt_fp8_causal.py, attention_under_recipe)."""
    example = _example()

    def run_layer(inp):
        layer = _module("TransformerLayer", seed=5).eval()
        example.attention_under_recipe(layer.self_attention.core_attention, _current())
        with torch.no_grad(), te.autocast(enabled=linear_recipe is not None, recipe=linear_recipe):
            return layer(inp)

    return _layer_prefix_change(run_layer)


def test_per_module_recipes_blockwise_linear_layers_are_causal(kernel_runs):
    from transformer_engine.pytorch.quantization import check_fp8_block_scaling_support

    supported, why = check_fp8_block_scaling_support()
    if not supported:
        pytest.skip(why)
    assert _nested_prefix_change(te_recipes.Float8BlockScaling()) == (0.0, 0)
    assert kernel_runs == ["current"] * 2


def test_per_module_recipes_bf16_linear_layers_are_causal(kernel_runs):
    assert _nested_prefix_change(None) == (0.0, 0)
    assert kernel_runs == ["current"] * 2


def test_per_module_recipes_current_scaling_linear_layers_leak(kernel_runs):
    """The negative control: the attention is mask-exact, the Linear layers' amax is not."""
    assert _nested_prefix_change(te_recipes.Float8CurrentScaling())[1] > 0
    assert kernel_runs == ["current"] * 2


def test_the_example_trains_and_is_causal(capsys):
    example = _example()
    argv = ["--steps", "4", "--num-layers", "2", "--batch-size", "2", "--seq-len", "256"]
    assert example.main(argv + ["--check-causality", "--log-every", "2"]) == 0
    out = capsys.readouterr().out
    assert "the model is causal" in out and "mask-exact FP8 attention: " in out
    assert "fallbacks: none" in out
