"""GPU tests of the mask-exact FP8 attention backward (triton/backward.py, backward_kernel.py;
on an sm90 GPU with the extension's CUDA kernels, the calls they run take cuda/backward.py, as
kernels.choose_backward_backend picks; tests/pytorch/attention/test_exact_fp8_backward_sm90.py
forces each backend and compares them).

Run by tools/gpu_backward_check.sh. Through the fork's autograd function (te/autograd.py,
MaskExactFP8AttentionFunc: the FP8 forward kernel, then the backward kernels) on PyTorch and
Triton alone; through DotProductAttention and TransformerLayer where the assembled fork over
upstream TE is importable (else those tests skip with the reason). Headline checks are bitwise
(torch.equal), each printed as an "exactness" line (cases, violations) for the script's summary:

  * prefix gradients of a loss over rows <= t under perturbations of Q, K, V after t, of every
    magnitude BF16 holds (random values up to 3e7, x1e3 .. x1e7 scalings, values near 1e37),
    with torch's BF16 SDPA backward as each case's control: wherever the control's prefix
    gradients keep their bits, the fork's must too;
  * padding garbage (random, NaN, Inf, 3e38) in Q, K, V (and dO) changes no real gradient or
    output, bshd padding_causal and thd with gaps; padded positions get zero gradients;
  * batch and thd-sequence isolation; determinism (two runs, same bits);
  * negative controls that must be caught: the leaky emulation of the backward this replaced
    (unguarded=True), by large future values and by NaN padding.

Accuracy: the gradients against the fp64 reference of the same straight-through math
(reference/backward.py, REF_RTOL) and against the exact fp64 gradients (GRAD_RTOL).
"""

import contextlib
import dataclasses
import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.kernels import BACKEND_ENV
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.attention import (
    reference_attention,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.backward import (
    reference_attention_backward,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
    prefix_change,
    rel_frobenius_error,
)

_HAS_TRITON = importlib.util.find_spec("triton") is not None
pytestmark = [
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
        reason="needs a CUDA GPU with FP8 tensor cores (compute capability >= 8.9)",
    ),
    pytest.mark.skipif(not _HAS_TRITON, reason="needs Triton"),
]

if _HAS_TRITON:
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.te.autograd import (
        AttentionCall,
        MaskExactFP8AttentionFunc,
    )
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton import (
        backward as backward_module,
    )

RECIPES = ("current", "mxfp8")
HEAD_DIMS = (64, 128)

REF_RTOL = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
"""Relative Frobenius error against the fp64 reference of the same math (the straight-through
gradients, the forward's O in D). The kernels round P, dS and the dequantized Q, K to the input
dtype for their MMAs and accumulate in fp32; the errors of the summed terms are independent, so
the normwise error stays near one unit roundoff (BF16 2^-8 = 3.9e-3, FP16 2^-11 = 4.9e-4; the
CPU interpreter measured 3e-4 for FP16). The bounds are four roundoffs; a wrong scale, mask or
layout gives errors of order 1."""

GRAD_RTOL = 0.08
"""Relative Frobenius error against the exact fp64 gradients of unquantized attention: the
straight-through estimate over E4M3 Q and K (unit roundoff 2^-4) is off by a few percent (the
reference backward stays below 0.06 on the CPU, tests/cpu/te/test_dispatch.py), plus the
kernels' rounding (REF_RTOL)."""


# ---------------------------------------------------------------------------------------------
# Helpers


def _cu(lens, device="cuda"):
    return torch.tensor([0] + list(lens), device=device).cumsum(0).int()


def _rand(*shape, gen, scale=1.0, dtype=torch.bfloat16):
    return (torch.randn(*shape, generator=gen, device="cuda") * scale).to(dtype)


def _call(
    recipe, qkv_format, mask, cu_q, cu_kv, max_q, max_kv, window=None, pad_q=None, pad_kv=None
):
    left, right = window if window is not None else (-1, -1)
    return AttentionCall(
        recipe=recipe,
        use_power_2_scales=False,
        qkv_format=qkv_format,
        attn_mask_type=mask,
        window_size=(left, 0 if "causal" in mask else right),
        softmax_scale=None,
        max_seqlen_q=max_q,
        max_seqlen_kv=max_kv,
        requires_grad=True,
        cu_seqlens_q=cu_q,
        cu_seqlens_kv=cu_kv,
        cu_seqlens_q_padded=pad_q,
        cu_seqlens_kv_padded=pad_kv,
    )


def _fork(q, k, v, d_out, call, **backward_kwargs):
    """(out, dq, dk, dv) through MaskExactFP8AttentionFunc. backward_kwargs reach the
    launcher (launch_config, unguarded)."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    with _backward_kwargs(backward_kwargs):
        out = MaskExactFP8AttentionFunc.apply(*leaves, call)
        grads = torch.autograd.grad(out, leaves, d_out)
    return (out.detach(), *grads)


@contextlib.contextmanager
def _backward_kwargs(extra):
    """Hands `extra` (launch_config, unguarded: the Triton backward's own arguments) to the
    Triton backward, the backend forced to "triton" for the call (forward and backward)."""
    if not extra:
        yield
        return
    original = backward_module.exact_fp8_attention_backward

    def patched(*args, **kwargs):
        return original(*args, **kwargs, **extra)

    backward_module.exact_fp8_attention_backward = patched
    forced = os.environ.get(BACKEND_ENV)
    os.environ[BACKEND_ENV] = "triton"
    try:
        yield
    finally:
        backward_module.exact_fp8_attention_backward = original
        if forced is None:
            del os.environ[BACKEND_ENV]
        else:
            os.environ[BACKEND_ENV] = forced


def _dense_call(recipe, fmt, mask, batch, s_q, s_kv, lens=None, window=None):
    lens_q, lens_kv = lens if lens is not None else ([s_q] * batch, [s_kv] * batch)
    return _call(recipe, fmt, mask, _cu(lens_q), _cu(lens_kv), s_q, s_kv, window)


def _sdpa(q, k, v, d_out, is_causal=False):
    """torch's BF16 SDPA forward + backward on bshd tensors (the control): (out, dq, dk, dv).
    The flash backend in deterministic mode (its backward accumulates dQ in a fixed order);
    GQA by repeating the kv heads inside the graph (their gradients are summed back)."""
    leaves = [x.detach().clone().transpose(1, 2).requires_grad_() for x in (q, k, v)]
    rep = q.shape[2] // k.shape[2]
    k_h, v_h = (x.repeat_interleave(rep, dim=1) for x in leaves[1:])
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            out = F.scaled_dot_product_attention(leaves[0], k_h, v_h, is_causal=is_causal)
            grads = torch.autograd.grad(out, leaves, d_out.transpose(1, 2))
    finally:
        torch.use_deterministic_algorithms(deterministic)
    return tuple(x.detach().transpose(1, 2) for x in (out, *grads))


def _same_bits(a, b):
    """Elementwise: the same value (NaN counts as the same as NaN)."""
    return (a == b) | (torch.isnan(a) & torch.isnan(b))


def _control_changed(base, again, after, keep_q, keep_kv):
    """Prefix gradient elements of the control changed by a perturbation, counted only where the
    control gives the same bits twice on the base inputs: torch's flash SDPA backward adds dQ with
    atomics (measured on the H200: two runs differ), so its other elements decide there."""
    total = 0
    for a, a2, b, keep in zip(base[1:], again[1:], after[1:], (keep_q, keep_kv, keep_kv)):
        rows = keep.repeat(a.shape[0])
        a, a2, b = (x.flatten(0, 1)[rows] for x in (a, a2, b))
        total += int((_same_bits(a, a2) & ~_same_bits(a, b)).sum())
    return total


def test_sdpa_control_is_deterministic_where_it_decides():
    """The control compares runs bitwise: its output, dK and dV must give the same bits on the
    same inputs (dQ may not: _control_changed leaves its unstable elements out)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, d_out = (_rand(2, 512, n, 128, gen=gen) for n in (4, 2, 2, 4))
    first, second = _sdpa(q, k, v, d_out, True), _sdpa(q, k, v, d_out, True)
    for name, a, b in zip(("out", "dq", "dk", "dv"), first, second):
        stable = float(_same_bits(a, b).float().mean())
        print(f"sdpa control: {name} stable in {stable:.4f} of its elements")
    assert all(torch.equal(a, b) for a, b in zip(first[:1] + first[2:], second[:1] + second[2:]))


def _changed(base, after, keep_q, keep_kv):
    """Bitwise-changed elements of (dq at rows keep_q, dk and dv at positions keep_kv); bshd."""
    total = 0
    for a, b, keep in zip(base[1:], after[1:], (keep_q, keep_kv, keep_kv)):
        total += prefix_change(a.flatten(0, 1), b.flatten(0, 1), keep.repeat(a.shape[0]))[1]
    return total


def _report(name, cases, violations, extra=""):
    print(f"exactness {name}: cases={cases} violations={violations}{extra}")


# ---------------------------------------------------------------------------------------------
# Accuracy


ACCURACY_CASES = [
    dict(fmt="bshd", mask="causal"),
    dict(fmt="sbhd", mask="padding_causal", lens=([512, 300], [512, 300])),
    dict(fmt="bshd", mask="causal_bottom_right", s=(384, 512)),
    dict(fmt="bshd", mask="causal", window=(128, 0)),
    dict(fmt="bshd", mask="no_mask", heads=(8, 1)),
]


def _dense_inputs(case, gen, d, dtype):
    s_q, s_kv = case.get("s", (512, 512))
    h, h_kv = case.get("heads", (4, 2))
    fmt = case["fmt"]
    lead = (lambda s: (2, s)) if fmt == "bshd" else (lambda s: (s, 2))
    q, d_out = (_rand(*lead(s_q), h, d, gen=gen, dtype=dtype) for _ in range(2))
    k, v = (_rand(*lead(s_kv), h_kv, d, gen=gen, dtype=dtype) for _ in range(2))
    lens = case.get("lens")
    call = _dense_call(
        None, fmt, case["mask"], 2, s_q, s_kv, lens, case.get("window")
    )  # recipe set by the caller
    return q, k, v, d_out, call


def _reference_kwargs(call: AttentionCall):
    kw = dict(qkv_format=call.qkv_format, attn_mask_type=call.attn_mask_type)
    kw["window_size"] = call.window_size
    kw.update(cu_seqlens_q=call.cu_seqlens_q.cpu(), cu_seqlens_kv=call.cu_seqlens_kv.cpu())
    for side in ("q", "kv"):
        pad = getattr(call, f"cu_seqlens_{side}_padded")
        kw[f"cu_seqlens_{side}_padded"] = None if pad is None else pad.cpu()
    return kw


@pytest.mark.parametrize(
    "recipe,d,dtype",
    [(r, d, torch.bfloat16) for r in RECIPES for d in HEAD_DIMS]
    + [("current", 64, torch.float16), ("mxfp8", 128, torch.float16)],
)
def test_accuracy_against_the_reference_of_the_same_math(recipe, d, dtype):
    gen = torch.Generator(device="cuda").manual_seed(1)
    for case in ACCURACY_CASES:
        q, k, v, d_out, call = _dense_inputs(case, gen, d, dtype)
        call = dataclasses.replace(call, recipe=recipe)
        out, *grads = _fork(q, k, v, d_out, call)
        ref = reference_attention_backward(recipe, q, k, v, out, d_out, **_reference_kwargs(call))
        for name, g, r in zip("qkv", grads, ref):
            err = rel_frobenius_error(g.cpu(), r)
            assert torch.isfinite(g).all() and err < REF_RTOL[dtype], (case, name, err)


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("recipe", RECIPES)
def test_accuracy_against_exact_gradients(recipe, d):
    gen = torch.Generator(device="cuda").manual_seed(2)
    q, k, v, d_out, call = _dense_inputs(dict(fmt="bshd", mask="causal"), gen, d, torch.bfloat16)
    _, *grads = _fork(q, k, v, d_out, dataclasses.replace(call, recipe=recipe))
    leaves = [x.cpu().double().requires_grad_() for x in (q, k, v)]
    out = reference_attention("bf16", *leaves, attn_mask_type="causal").out
    exact = torch.autograd.grad(out, leaves, d_out.cpu().double())
    errors = [rel_frobenius_error(g.cpu(), e) for g, e in zip(grads, exact)]
    print(f"accuracy {recipe} d={d}: relative errors dq, dk, dv = {errors}")
    assert max(errors) < GRAD_RTOL, errors


@pytest.mark.parametrize("recipe", RECIPES)
def test_launch_configs_of_the_benchmark_are_accurate(recipe):
    """The alternative block sizes the benchmark times give gradients of the same accuracy."""
    bench = _bench_module()
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v, d_out, call = _dense_inputs(dict(fmt="bshd", mask="causal"), gen, 128, torch.bfloat16)
    call = dataclasses.replace(call, recipe=recipe)
    for config in bench.LAUNCH_ALTERNATIVES[recipe]:
        out, *grads = _fork(q, k, v, d_out, call, launch_config=config)
        ref = reference_attention_backward(recipe, q, k, v, out, d_out, **_reference_kwargs(call))
        errors = [rel_frobenius_error(g.cpu(), r) for g, r in zip(grads, ref)]
        assert max(errors) < REF_RTOL[torch.bfloat16], (config, errors)


def _bench_module():
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "attention" / "bench_backward.py"
    spec = importlib.util.spec_from_file_location("bench_backward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_backward_is_deterministic():
    gen = torch.Generator(device="cuda").manual_seed(4)
    for recipe in RECIPES:
        q, k, v, d_out, call = _dense_inputs(
            dict(fmt="bshd", mask="causal", heads=(8, 2)), gen, 128, torch.bfloat16
        )
        call = dataclasses.replace(call, recipe=recipe)
        first, second = _fork(q, k, v, d_out, call), _fork(q, k, v, d_out, call)
        assert all(torch.equal(a, b) for a, b in zip(first, second)), recipe


# ---------------------------------------------------------------------------------------------
# Prefix invariance under future values of every magnitude, with BF16 SDPA as the control


def _future_values(name, shape, gen):
    """The perturbation's values (fp32) for the positions after t; all finite in BF16."""
    randn = lambda: torch.randn(shape, generator=gen, device="cuda")
    if name == "random-3e7":
        return (torch.rand(shape, generator=gen, device="cuda") * 2 - 1) * 3e7
    if name.startswith("x"):
        return randn() * float(name[1:])
    if name == "near-1e37":
        return torch.sign(randn()) * 1e37 * (1 + torch.rand(shape, generator=gen, device="cuda"))
    if name == "max-bf16":
        return torch.full(shape, 3.38e38, device="cuda")
    raise ValueError(name)


MAGNITUDES = ("random-3e7", "x1e3", "x1e4", "x1e5", "x1e6", "x1e7", "near-1e37", "max-bf16")
TARGETS = ("q", "k", "v", "qkv")


@dataclasses.dataclass
class _Tally:
    cases: int = 0
    violations: int = 0
    control_changed: int = 0
    fork_changed_with_control: int = 0


def _prefix_case(recipe, d, magnitude, target, gen, unguarded=False):
    """(control changed, fork changed) prefix gradient elements, causal bshd, t = 300 of 512."""
    b, s, h, h_kv, t = 2, 512, 4, 2, 300
    q, k, v = (_rand(b, s, n, d, gen=gen) for n in (h, h_kv, h_kv))
    d_out = _rand(b, s, h, d, gen=gen)
    d_out[:, t + 1 :] = 0  # the loss is over rows <= t
    pert = []
    for name, x in zip("qkv", (q, k, v)):
        y = x.clone()
        if name in target:
            y[:, t + 1 :] = _future_values(magnitude, y[:, t + 1 :].shape, gen).bfloat16()
        pert.append(y)
    keep = torch.arange(s, device="cuda") <= t
    base = _sdpa(q, k, v, d_out, is_causal=True)
    again = _sdpa(q, k, v, d_out, is_causal=True)
    control = _control_changed(base, again, _sdpa(*pert, d_out, is_causal=True), keep, keep)
    call = _dense_call(recipe, "bshd", "causal", b, s, s)
    extra = dict(unguarded=True) if unguarded else {}
    fork = _changed(
        _fork(q, k, v, d_out, call, **extra), _fork(*pert, d_out, call, **extra), keep, keep
    )
    return control, fork


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("recipe", RECIPES)
def test_future_values_change_no_prefix_gradient(recipe, d):
    gen = torch.Generator(device="cuda").manual_seed(10 + d)
    tally, failures = _Tally(), []
    for magnitude in MAGNITUDES:
        for target in TARGETS:
            control, fork = _prefix_case(recipe, d, magnitude, target, gen)
            tally.cases += 1
            if control:
                tally.control_changed += 1
                tally.fork_changed_with_control += int(fork > 0)
            elif fork:
                tally.violations += 1
                failures.append((magnitude, target, fork))
    _report(
        f"prefix-gradients-vs-sdpa {recipe} d={d}", tally.cases, tally.violations,
        f" (control changed in {tally.control_changed}, the fork too in"
        f" {tally.fork_changed_with_control})",
    )  # fmt: skip
    assert tally.cases - tally.control_changed >= len(MAGNITUDES)  # the control mostly holds
    assert not failures, failures


@pytest.mark.parametrize("recipe", RECIPES)
def test_leaky_emulation_is_caught_by_future_values(recipe):
    """Negative control: the backward this replaced (scores of dequantized Q, K in BF16, no
    clamp, masks by multiplication), where the control keeps its bits (issue 21: K x1e7)."""
    gen = torch.Generator(device="cuda").manual_seed(20)
    caught = 0
    for magnitude, target in (("x1e7", "k"), ("random-3e7", "qkv"), ("near-1e37", "qk")):
        control, fork = _prefix_case(recipe, 128, magnitude, target, gen, unguarded=True)
        caught += int(control == 0 and fork > 0)
    print(f"negative-control leaky-backward {recipe}: caught {caught}/3")
    assert caught > 0


# ---------------------------------------------------------------------------------------------
# Padding garbage, batch and thd isolation

GARBAGE = {"random": None, "nan": float("nan"), "inf": float("inf"), "3e38": 3e38}


def _fill(x, where, value, gen):
    """x with the token positions `where` ([t] bool over the token axis, token-major view)
    replaced by garbage."""
    y = x.clone()
    tokens = y.view(-1, *y.shape[-2:]) if y.dim() == 3 else y.flatten(0, 1)
    if value is None:
        noise = torch.randn(tokens.shape, generator=gen, device="cuda") * 1e4
        tokens[where] = noise[where].to(y.dtype)
    else:
        tokens[where] = value
    return y


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("recipe", RECIPES)
def test_padding_garbage_changes_no_real_output_or_gradient(recipe, d):
    """bshd padding_causal with lengths [256, 150] (the issue's case): garbage in the padded
    positions of Q, K, V and dO. Real outputs and gradients keep their bits; padded positions'
    gradients are 0."""
    gen = torch.Generator(device="cuda").manual_seed(30 + d)
    lens, s = [256, 150], 256
    q, k, v, d_out = (_rand(2, s, n, d, gen=gen) for n in (4, 2, 2, 4))
    call = _dense_call(recipe, "bshd", "padding_causal", 2, s, s, (lens, lens))
    real = torch.cat([torch.arange(s, device="cuda") < n for n in lens])
    base = _fork(q, k, v, d_out, call)
    violations = 0
    for name, value in GARBAGE.items():
        after = _fork(*(_fill(x, ~real, value, gen) for x in (q, k, v, d_out)), call)
        for a, b in zip(base, after):
            a, b = a.flatten(0, 1), b.flatten(0, 1)
            violations += prefix_change(a, b, real)[1]
        violations += sum(int(g.flatten(0, 1)[~real].any()) for g in after[1:])
    _report(f"padding-garbage {recipe} d={d}", len(GARBAGE), violations)
    assert violations == 0


@pytest.mark.parametrize("recipe", RECIPES)
def test_leaky_emulation_is_caught_by_padding(recipe):
    gen = torch.Generator(device="cuda").manual_seed(35)
    lens, s = [256, 150], 256
    q, k, v, d_out = (_rand(2, s, n, 128, gen=gen) for n in (4, 2, 2, 4))
    call = _dense_call(recipe, "bshd", "padding_causal", 2, s, s, (lens, lens))
    real = torch.cat([torch.arange(s, device="cuda") < n for n in lens])
    base = _fork(q, k, v, d_out, call, unguarded=True)
    after = _fork(
        *(_fill(x, ~real, float("nan"), gen) for x in (q, k, v)), d_out, call, unguarded=True
    )
    changed = sum(
        prefix_change(a.flatten(0, 1), b.flatten(0, 1), real)[1]
        for a, b in zip(base[1:], after[1:])
    )
    print(f"negative-control leaky-backward padding {recipe}: changed={changed}")
    assert changed > 0


def _thd_pack(lens, gaps, h, h_kv, d, gen):
    cu, cu_pad = _cu(lens), _cu([n + g for n, g in zip(lens, gaps)])
    t = int(cu_pad[-1])
    real = torch.zeros(t, dtype=torch.bool, device="cuda")
    for start, n in zip(cu_pad[:-1].tolist(), lens):
        real[start : start + n] = True
    q, d_out = (_rand(t, h, d, gen=gen) for _ in range(2))
    k, v = (_rand(t, h_kv, d, gen=gen) for _ in range(2))
    return q, k, v, d_out, cu, cu_pad, real


@pytest.mark.parametrize("recipe", RECIPES)
def test_thd_gap_garbage_and_sequence_isolation(recipe):
    """thd padding_causal with gaps between sequences: garbage in the gaps changes nothing real
    and the gaps' gradients are 0; changing sequence 1 changes nothing of sequences 0 and 2."""
    gen = torch.Generator(device="cuda").manual_seed(40)
    lens, gaps = [300, 1, 257], [40, 0, 9]
    q, k, v, d_out, cu, cu_pad, real = _thd_pack(lens, gaps, 4, 2, 128, gen)
    call = _call(
        recipe, "thd", "padding_causal", cu, cu, max(lens), max(lens), None, cu_pad, cu_pad
    )
    base = _fork(q, k, v, d_out, call)
    violations = 0
    for value in GARBAGE.values():
        after = _fork(*(_fill(x, ~real, value, gen) for x in (q, k, v, d_out)), call)
        violations += sum(prefix_change(a, b, real)[1] for a, b in zip(base, after))
        violations += sum(int(g[~real].any()) for g in after[1:])
    seq1 = torch.zeros_like(real)
    seq1[int(cu_pad[1]) : int(cu_pad[2])] = True
    after = _fork(*(_fill(x, seq1, 3e38, gen) for x in (q, k, v)), d_out, call)
    others = real & ~seq1
    violations += sum(prefix_change(a, b, others)[1] for a, b in zip(base, after))
    _report(f"thd-gaps-and-sequences {recipe}", len(GARBAGE) + 1, violations)
    assert violations == 0


@pytest.mark.parametrize("recipe", RECIPES)
def test_batch_isolation(recipe):
    """no_mask bshd: sample 1 turned to 3e38 / NaN changes no output or gradient of sample 0."""
    gen = torch.Generator(device="cuda").manual_seed(50)
    q, k, v, d_out = (_rand(2, 384, n, 128, gen=gen) for n in (4, 2, 2, 4))
    call = _dense_call(recipe, "bshd", "no_mask", 2, 384, 384)
    base = _fork(q, k, v, d_out, call)
    violations = 0
    sample0 = torch.arange(2 * 384, device="cuda") < 384
    for value in (3e38, float("nan")):
        after = _fork(*(_fill(x, ~sample0, value, gen) for x in (q, k, v)), d_out, call)
        violations += sum(
            prefix_change(a.flatten(0, 1), b.flatten(0, 1), sample0)[1] for a, b in zip(base, after)
        )
    _report(f"batch-isolation {recipe}", 2, violations)
    assert violations == 0


# ---------------------------------------------------------------------------------------------
# Through Transformer Engine (the assembled fork over upstream TE), where importable


def _te():
    try:
        import transformer_engine.pytorch as te
        from transformer_engine.common import recipe as te_recipes
        from transformer_engine.pytorch.attention.dot_product_attention import (
            dot_product_attention as dpa_module,
        )
        from transformer_engine.pytorch.attention import multi_head_attention as mha_module
    except Exception as error:  # pylint: disable=broad-exception-caught
        pytest.skip(f"needs transformer_engine.pytorch from the assembled fork: {error}")
    if not hasattr(dpa_module, "exact_fp8_backend"):
        pytest.skip("TE without the fork")
    return te, te_recipes, dpa_module, mha_module


@pytest.fixture
def te_recipe(monkeypatch):
    """te_recipe(kind): (te, an autocast recipe whose DotProductAttention runs `kind` FP8)."""

    def make(kind):
        te, te_recipes, dpa_module, mha_module = _te()
        monkeypatch.setenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")
        current = te_recipes.Float8CurrentScaling(
            fp8_format=te_recipes.Format.E4M3, fp8_dpa=True, fp8_mha=False
        )
        if kind == "mxfp8":  # the NVTE_DPA_FP8_RECIPE switch, as TE reads it at import
            monkeypatch.setattr(dpa_module, "_dpa_fp8_recipe", "MXFP8BlockScaling")
            monkeypatch.setattr(mha_module, "_dpa_fp8_recipe", "MXFP8BlockScaling")
        return te, current

    return make


def _dpa_prefix(te, recipe, d, magnitude, target, gen):
    """(changed prefix gradient elements, of the BF16 control) through DotProductAttention."""
    b, s, h, h_kv, t = 2, 512, 4, 2, 300
    dpa = te.DotProductAttention(
        h, d, num_gqa_groups=h_kv, qkv_format="bshd", attn_mask_type="causal"
    )
    q, k, v = (_rand(b, s, n, d, gen=gen) for n in (h, h_kv, h_kv))
    d_out = _rand(b, s, h * d, gen=gen)
    d_out[:, t + 1 :] = 0
    pert = [x.clone() for x in (q, k, v)]
    for name, y in zip("qkv", pert):
        if name in target:
            y[:, t + 1 :] = _future_values(magnitude, y[:, t + 1 :].shape, gen).bfloat16()

    def grads(tensors, fp8):
        leaves = [x.clone().requires_grad_() for x in tensors]
        with te.autocast(enabled=fp8, recipe=recipe):
            out = dpa(*leaves)
        return (out.detach(), *torch.autograd.grad(out, leaves, d_out))

    keep = torch.arange(s, device="cuda") <= t
    fork = _changed(grads((q, k, v), True), grads(pert, True), keep, keep)
    control = _changed(grads((q, k, v), False), grads(pert, False), keep, keep)
    return fork, control


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("kind", RECIPES)
def test_through_te_dpa_prefix_gradients_vs_bf16_control(kind, d, te_recipe, backward_runs):
    te, recipe = te_recipe(kind)
    gen = torch.Generator(device="cuda").manual_seed(60 + d)
    cases = violations = 0
    for magnitude in ("random-3e7", "x1e3", "x1e7", "near-1e37"):
        for target in ("q", "k", "qkv"):
            fork, control = _dpa_prefix(te, recipe, d, magnitude, target, gen)
            cases += 1
            violations += int(control == 0 and fork > 0)
    _report(f"dpa-prefix-gradients {kind} d={d}", cases, violations)
    assert set(backward_runs) == {kind} and violations == 0


@pytest.mark.parametrize("kind", RECIPES)
def test_through_te_dpa_padding_garbage(kind, te_recipe, backward_runs):
    """DotProductAttention bshd padding_causal [256, 150]: garbage in the padding of Q, K, V."""
    te, recipe = te_recipe(kind)
    gen = torch.Generator(device="cuda").manual_seed(70)
    lens, s, h, h_kv, d = [256, 150], 256, 4, 2, 128
    dpa = te.DotProductAttention(
        h, d, num_gqa_groups=h_kv, qkv_format="bshd", attn_mask_type="padding_causal"
    )
    q, k, v = (_rand(2, s, n, d, gen=gen) for n in (h, h_kv, h_kv))
    d_out = _rand(2, s, h * d, gen=gen)
    cu = _cu(lens)
    real = torch.cat([torch.arange(s, device="cuda") < n for n in lens])

    def grads(tensors):
        leaves = [x.clone().requires_grad_() for x in tensors]
        with te.autocast(enabled=True, recipe=recipe):
            out = dpa(*leaves, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=s, max_seqlen_kv=s)
        return (out.detach().view(2, s, h, d), *torch.autograd.grad(out, leaves, d_out))

    base = grads((q, k, v))
    violations = 0
    for value in GARBAGE.values():
        after = grads([_fill(x, ~real, value, gen) for x in (q, k, v)])
        violations += sum(
            prefix_change(a.flatten(0, 1), b.flatten(0, 1), real)[1] for a, b in zip(base, after)
        )
    _report(f"dpa-padding-garbage {kind}", len(GARBAGE), violations)
    assert set(backward_runs) == {kind} and violations == 0


@pytest.mark.parametrize("kind", RECIPES)
def test_through_te_transformer_layer_prefix_input_gradients(kind, te_recipe, backward_runs):
    """A TransformerLayer with BF16 Linear layers and mask-exact FP8 attention (nested autocast,
    as examples/gpt_fp8_causal.py runs it): the input gradients of a loss over rows <= t keep
    their bits when the rows after t turn to large values; the all-BF16 layer is the control."""
    te, recipe = te_recipe(kind)
    gen = torch.Generator(device="cuda").manual_seed(80)
    batch, s, hidden, t = 2, 384, 512, 190
    torch.manual_seed(5)
    layer = te.TransformerLayer(
        hidden, 1024, 4, hidden_dropout=0.0, attention_dropout=0.0, self_attn_mask_type="causal",
        attn_input_format="bshd", params_dtype=torch.bfloat16, num_gqa_groups=2,
    ).cuda()  # fmt: skip
    core = layer.self_attention.core_attention
    x = _rand(batch, s, hidden, gen=gen)
    x_future = x.clone()
    x_future[:, t + 1 :] = _rand(batch, s - t - 1, hidden, gen=gen, scale=1e3)
    d_y = _rand(batch, s, hidden, gen=gen)
    d_y[:, t + 1 :] = 0

    def input_grad(inp, fp8):
        forward = core.forward

        def under_recipe(*args, **kwargs):
            with te.autocast(enabled=fp8, recipe=recipe):
                return forward(*args, **kwargs)

        core.forward = under_recipe
        try:
            leaf = inp.clone().requires_grad_()
            y = layer(leaf)
            return torch.autograd.grad(y, leaf, d_y)[0]
        finally:
            core.forward = forward

    keep = (torch.arange(s, device="cuda") <= t).repeat(batch)
    changed = {}
    for fp8 in (True, False):
        a, b = (input_grad(inp, fp8).view(batch * s, 1, hidden) for inp in (x, x_future))
        changed[fp8] = prefix_change(a, b, keep)[1]
    _report(
        f"transformer-layer-input-gradients {kind}",
        1,
        int(changed[False] == 0 and changed[True] > 0),
    )
    assert changed[False] == 0 and changed[True] == 0 and set(backward_runs) == {kind}
