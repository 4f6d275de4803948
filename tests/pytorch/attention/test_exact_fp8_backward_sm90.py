"""GPU tests of the sm_90a CUDA attention backward (exact_fp8/cuda/backward.py, the "cuda"
backend's backward; docs/backward.md, "The sm90 CUDA backward").

For the subset it runs (bshd and sbhd, bf16 and fp16, d = 128, current scaling, causal /
no_mask, MHA and GQA):
- headline: bitwise invariance (torch.equal) of every gradient a mask hides from a perturbation:
  a loss over rows <= t, the tokens after t replaced by finite values of every magnitude bf16
  holds (no control needed: for finite values the backward's arithmetic leaves no path, see
  docs/backward.md); another sample's values; with a visible perturbation as the control that
  must be seen;
- determinism (two runs, same bits);
- accuracy: against the fp64 reference of the same straight-through math, against the exact
  fp64 gradients, and against the Triton backward (the second implementation) on the same
  forward outputs, each within a stated tolerance;
- the backend choice: the CUDA backward runs what it supports, the Triton backward the rest.
"""

import pytest
import torch

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import kernels
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.cuda import backward
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.attention import (
    reference_attention,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.backward import (
    reference_attention_backward,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
    rel_frobenius_error,
)


def _skip_reason():
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if torch.cuda.get_device_capability() != (9, 0):
        return "the CUDA attention kernels are built for sm_90a (Hopper) only"
    if not backward.extension_has_backward():
        return "transformer_engine_exact_fp8 was built without the sm_90a backward kernels"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))

MASKS = ("causal", "no_mask")
DTYPES = [torch.bfloat16, torch.float16]  # the inputs', the 16-bit operands' and the gradients'
# (b, s_q, s_kv, h, h_kv): tile-aligned and ragged lengths, s_q != s_kv, MHA, GQA and MQA; one
# row block added to by many key tiles (the longest chain of Note [Ordered dQ accumulation]), a
# group of 8 with a key tile whose second warpgroup holds no real key, an odd batch.
SHAPES = [
    (2, 128, 128, 4, 4),
    (2, 300, 300, 4, 2),
    (1, 1024, 1024, 4, 1),
    (2, 77, 200, 4, 4),
    (2, 384, 130, 4, 2),
    (1, 64, 1000, 2, 2),
    (1, 193, 129, 8, 1),
    (3, 640, 640, 2, 2),
]

REF_RTOL = 1.6e-2
"""Relative Frobenius error against the fp64 reference of the same math (and between the CUDA
and Triton backwards): both kernels round P, dS and the dequantized Q, K to bf16 for their MMAs
and accumulate in fp32, in different orders, so they differ from the reference (and from each
other) by about one bf16 unit roundoff (2^-8 = 3.9e-3) normwise; the bound is four roundoffs, the
one test_exact_fp8_backward.py uses. A wrong scale, mask or layout gives errors of order 1."""

GRAD_RTOL = 0.08
"""Against the exact fp64 gradients of unquantized attention: the straight-through estimate
over E4M3 Q and K is off by a few percent (test_exact_fp8_backward.py's bound)."""

BF16_MAX = 3.3895313892515355e38
MAGNITUDES = (3e7, 1e3, 1e5, 1e7, 1e37, BF16_MAX)


def _inputs(seed, b, s_q, s_kv, h, h_kv, outliers=True, dtype=torch.bfloat16):
    """q, k, v, d_out: N(0, 1) in `dtype`, with x50 outliers (1%) when `outliers`; on the GPU."""
    gen = torch.Generator().manual_seed(seed)

    def make(shape):
        x = torch.randn(*shape, generator=gen)
        if outliers:
            x = torch.where(torch.rand(*shape, generator=gen) < 0.01, 50 * x, x)
        return x.to(dtype).cuda()

    return (
        make((b, s_q, h, 128)),
        make((b, s_kv, h_kv, 128)),
        make((b, s_kv, h_kv, 128)),
        make((b, s_q, h, 128)),
    )


def _grads(q, k, v, d_out, mask, backend="cuda", forward=None):
    """(dq, dk, dv) of the CUDA forward's out and lse through `backend`'s backward."""
    kw = dict(recipe="current", attn_mask_type=mask)
    out, lse = (
        forward if forward is not None else kernels.attention_forward(q, k, v, backend="cuda", **kw)
    )
    return kernels.attention_backward(q, k, v, out, d_out, lse, backend=backend, **kw)


def test_backward_backend_is_chosen_for_what_it_runs(monkeypatch):
    monkeypatch.delenv(kernels.BACKEND_ENV, raising=False)
    q, k, v, _ = _inputs(0, 1, 64, 64, 2, 2)
    assert (
        kernels.choose_backward_backend(q, k, v, recipe="current", attn_mask_type="causal")
        == "cuda"
    )
    for kw in (
        dict(recipe="mxfp8", attn_mask_type="causal"),
        dict(recipe="current", attn_mask_type="causal_bottom_right"),
        dict(recipe="current", attn_mask_type="padding_causal"),
        dict(recipe="current", attn_mask_type="causal", window_size=(32, 0)),
        dict(recipe="current", attn_mask_type="causal", unguarded=True),
    ):
        assert kernels.choose_backward_backend(q, k, v, **kw) == "triton", kw
    assert (
        kernels.choose_backward_backend(q[..., :64], k[..., :64], v[..., :64], recipe="current")
        == "triton"
    )
    monkeypatch.setenv(kernels.BACKEND_ENV, "triton")
    assert kernels.choose_backward_backend(q, k, v, recipe="current") == "triton"


@pytest.mark.parametrize("mask", MASKS)
def test_sbhd_runs_the_cuda_backward_and_equals_bshd_bit_for_bit(mask):
    """An sbhd call takes the CUDA backward (bshd copies of V and dO, cuda/backward.py): its
    gradients are the bshd call's transposed, bit for bit, contiguous in sbhd."""
    q, k, v, d_out = _inputs(41, 2, 300, 300, 4, 2)
    want = _grads(q, k, v, d_out, mask)
    qs, ks, vs, ds = (x.transpose(0, 1).contiguous() for x in (q, k, v, d_out))
    kw = dict(recipe="current", qkv_format="sbhd", attn_mask_type=mask)
    assert kernels.choose_backward_backend(qs, ks, vs, **kw) == "cuda"
    out, lse = kernels.attention_forward(qs, ks, vs, backend="cuda", **kw)
    got = kernels.attention_backward(qs, ks, vs, out, ds, lse, backend="cuda", **kw)
    for g, w, x in zip(got, want, (qs, ks, vs)):
        assert g.shape == x.shape and g.is_contiguous()
        assert torch.equal(g.transpose(0, 1), w)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_dequantized_rows_are_the_triton_backwards_operands(dtype):
    """triton.backward.dequantized_rows (the CUDA backward's Q_dq and K_dq) against its formula:
    x8 * scale_inv in fp32, saturated to the dtype's finite range, rounded to it; bit for bit,
    with scales that overflow the dtype and E4M3 NaN."""
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton.backward import (
        dequantized_rows,
    )

    gen = torch.Generator().manual_seed(9)
    x8 = (torch.randn(2, 300, 128, generator=gen) * 100).to(torch.float8_e4m3fn)
    x8[0, 7, 3] = float("nan")
    scale = torch.rand(2, 300, generator=gen) * 2
    largest = torch.finfo(dtype).max
    scale[1, 5] = 3e36 if dtype == torch.bfloat16 else 300.0  # 448 * it > the max: saturates
    x8, scale = x8.cuda(), scale.cuda()
    got = dequantized_rows(x8, scale, dtype)
    want = (x8.float() * scale.unsqueeze(-1)).clamp(-largest, largest).to(dtype)
    assert got.dtype == dtype
    assert torch.isnan(got[0, 7, 3]) and torch.isfinite(got[1, 5]).all()
    same = (got == want) | (torch.isnan(got) & torch.isnan(want))
    assert same.all()


def test_unsupported_calls_raise():
    q, k, v, d_out = _inputs(0, 1, 64, 64, 2, 2)
    out, lse = kernels.attention_forward(q, k, v, backend="triton", recipe="mxfp8")
    with pytest.raises(ValueError, match="does not run this call"):
        kernels.attention_backward(q, k, v, out, d_out, lse, backend="cuda", recipe="mxfp8")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mask", MASKS)
def test_agrees_with_the_triton_backward_and_the_reference(mask, shape, dtype):
    """REF_RTOL against the Triton backward and the fp64 reference, in bf16 and fp16 (fp16: the
    16-bit operands and the gradients in fp16, a finer rounding than REF_RTOL's bf16 reasoning)."""
    q, k, v, d_out = _inputs(1, *shape, outliers=False, dtype=dtype)  # REF_RTOL: N(0, 1)
    kw = dict(recipe="current", attn_mask_type=mask)
    fwd = kernels.attention_forward(q, k, v, backend="cuda", **kw)
    cuda = _grads(q, k, v, d_out, mask, "cuda", fwd)
    triton = _grads(q, k, v, d_out, mask, "triton", fwd)
    ref = reference_attention_backward("current", q, k, v, fwd[0], d_out, attn_mask_type=mask)
    for name, c, t, r in zip(("dq", "dk", "dv"), cuda, triton, ref):
        assert torch.isfinite(c).all() and c.dtype == dtype, name
        vs_triton = rel_frobenius_error(c.float().cpu(), t.float().cpu())
        vs_ref = rel_frobenius_error(c.cpu(), r)
        assert vs_triton < REF_RTOL and vs_ref < REF_RTOL, (name, vs_triton, vs_ref)


@pytest.mark.parametrize("mask", MASKS)
def test_accuracy_against_exact_gradients(mask):
    q, k, v, d_out = _inputs(2, 2, 512, 512, 4, 2, outliers=False)
    grads = _grads(q, k, v, d_out, mask)
    leaves = [x.cpu().double().requires_grad_() for x in (q, k, v)]
    out = reference_attention("bf16", *leaves, attn_mask_type=mask).out
    exact = torch.autograd.grad(out, leaves, d_out.cpu().double())
    errors = [rel_frobenius_error(g.cpu(), e) for g, e in zip(grads, exact)]
    print(f"accuracy cuda backward {mask}: relative errors dq, dk, dv = {errors}")
    assert max(errors) < GRAD_RTOL, errors


@pytest.mark.parametrize("mask", MASKS)
def test_long_sums_of_one_sign_agree_with_the_triton_backward(mask):
    """Note [Two-level P.V accumulation] for the backward: with V and dO ~ N(4, 1), dV of a key
    sums same-sign terms over all 32 query tiles (s = 4k), and dP carries the offset. Both
    backwards hold such sums in fp32 (bf16 products, fp32 accumulators, different orders and
    code generators), so they agree within REF_RTOL.
    (Against the exact gradients of unquantized attention both are off more than BF16 here,
    through the backward's rule, not the kernels: D = rowsum(dO * O) takes the forward's FP8 O,
    so dP's large common part does not cancel in dS = P * (dP - D). Measured on the H200,
    2026-12-04: dq, dk, dv off by 0.17 / 0.087 / 0.0044 (causal) where torch's BF16 SDPA backward
    is off by 0.022 / 0.0087 / 0.0017; benchmarks/results/backward_h200.md,
    bench_backward_delta.py.)"""
    gen = torch.Generator().manual_seed(13)
    q, k, v, d_out = (torch.randn(1, 4096, 2, 128, generator=gen) for _ in range(4))
    q, k = q.bfloat16().cuda(), k.bfloat16().cuda()
    v, d_out = (v + 4.0).bfloat16().cuda(), (d_out + 4.0).bfloat16().cuda()
    kw = dict(recipe="current", attn_mask_type=mask)
    fwd = kernels.attention_forward(q, k, v, backend="cuda", **kw)
    cuda = _grads(q, k, v, d_out, mask, "cuda", fwd)
    triton = _grads(q, k, v, d_out, mask, "triton", fwd)
    for name, c, t in zip(("dq", "dk", "dv"), cuda, triton):
        vs_triton = rel_frobenius_error(c.float().cpu(), t.float().cpu())
        assert vs_triton < REF_RTOL, (name, vs_triton)


def test_backward_is_deterministic():
    q, k, v, d_out = _inputs(3, 2, 700, 700, 8, 2)
    first, second = _grads(q, k, v, d_out, "causal"), _grads(q, k, v, d_out, "causal")
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("mask", MASKS)
def test_dq_sum_order_is_fixed_under_contention(mask):
    """Note [Ordered dQ accumulation]: 32 key tiles add to every row block (no mask) or up to 32
    (causal) through the counters; repeated runs, which schedule the CTAs differently, give the
    same bits."""
    q, k, v, d_out = _inputs(4, 2, 4096, 4096, 8, 8)
    first = _grads(q, k, v, d_out, mask)
    for _ in range(4):
        again = _grads(q, k, v, d_out, mask)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("mask", MASKS)
def test_long_sequences_agree_with_the_triton_backward(mask):
    """160 key tiles and 160 query tiles of one (sample, head), more CTAs than the GPU holds at
    once: the gradients agree with the Triton backward's within REF_RTOL."""
    q, k, v, d_out = _inputs(8, 1, 20480, 20480, 1, 1, outliers=False)
    kw = dict(recipe="current", attn_mask_type=mask)
    fwd = kernels.attention_forward(q, k, v, backend="cuda", **kw)
    cuda = _grads(q, k, v, d_out, mask, "cuda", fwd)
    triton = _grads(q, k, v, d_out, mask, "triton", fwd)
    for c, t in zip(cuda, triton):
        assert rel_frobenius_error(c.float().cpu(), t.float().cpu()) < REF_RTOL


def _future(x, t, value, gen):
    y = x.clone()
    tail = y[:, t + 1 :]
    largest = torch.finfo(x.dtype).max
    signs = torch.randint(0, 2, tail.shape, generator=gen).mul(2).sub(1).to(tail.device)
    y[:, t + 1 :] = (
        (signs * value * (0.5 + torch.rand(tail.shape, generator=gen).to(tail.device) / 2))
        .clamp(-largest, largest)
        .to(x.dtype)
    )
    return y


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("t", (0, 300, 511, 700))
def test_future_values_change_no_prefix_gradient_bit(t, dtype):
    """A loss over rows <= t (dO = 0 after t): Q, K, V after t replaced by finite values of every
    magnitude the dtype holds (one at a time and all three) change no bit of dQ at rows <= t and
    dK, dV at keys <= t, causal, GQA, t inside a tile and on a tile's last row."""
    b, s, h, h_kv = 2, 1000, 4, 2
    q, k, v, d_out = _inputs(4, b, s, s, h, h_kv, dtype=dtype)
    d_out[:, t + 1 :] = 0
    base = _grads(q, k, v, d_out, "causal")
    gen = torch.Generator().manual_seed(t)
    largest = torch.finfo(dtype).max
    for value in sorted({min(m, largest) for m in MAGNITUDES}):
        for target in ("q", "k", "v", "qkv"):
            pert = [
                _future(x, t, value, gen) if n in target else x for n, x in zip("qkv", (q, k, v))
            ]
            after = _grads(*pert, d_out, "causal")
            for name, a, c in zip(("dq", "dk", "dv"), base, after):
                assert torch.equal(a[:, : t + 1], c[:, : t + 1]), (value, target, name)


def test_control_a_visible_change_is_seen():
    """The control of the test above: the same perturbation at and before t changes the prefix
    gradients (the comparison sees what it should)."""
    q, k, v, d_out = _inputs(5, 2, 512, 512, 4, 2)
    t = 300
    d_out[:, t + 1 :] = 0
    base = _grads(q, k, v, d_out, "causal")
    k2 = k.clone()
    k2[:, t] *= 3
    after = _grads(q, k2, v, d_out, "causal")
    assert all(not torch.equal(a[:, : t + 1], c[:, : t + 1]) for a, c in zip(base, after))


@pytest.mark.parametrize("mask", MASKS)
def test_other_sample_changes_nothing(mask):
    q, k, v, d_out = _inputs(6, 2, 300, 300, 4, 2)
    base = _grads(q, k, v, d_out, mask)
    gen = torch.Generator().manual_seed(6)
    pert = [x.clone() for x in (q, k, v, d_out)]
    for x in pert:
        x[1] = (torch.randn(x[1].shape, generator=gen) * 1e30).bfloat16().cuda()
    after = _grads(*pert, mask)
    for a, c in zip(base, after):
        assert torch.equal(a[0], c[0])


def test_autograd_runs_the_cuda_backward(monkeypatch):
    """Through the fork's autograd function with the backend unset: the CUDA backward runs
    (the same bits as calling it), and a forced Triton backend gives gradients within REF_RTOL."""
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.te.autograd import (
        AttentionCall,
        MaskExactFP8AttentionFunc,
    )

    monkeypatch.delenv(kernels.BACKEND_ENV, raising=False)
    q, k, v, d_out = _inputs(7, 2, 256, 256, 4, 2)
    call = AttentionCall(
        recipe="current", use_power_2_scales=False, qkv_format="bshd", attn_mask_type="causal",
        window_size=(-1, 0), softmax_scale=None, max_seqlen_q=256, max_seqlen_kv=256,
        requires_grad=True, cu_seqlens_q=None, cu_seqlens_kv=None, cu_seqlens_q_padded=None,
        cu_seqlens_kv_padded=None,
    )  # fmt: skip

    def autograd():
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out = MaskExactFP8AttentionFunc.apply(*leaves, call)
        return torch.autograd.grad(out, leaves, d_out)

    direct = _grads(q, k, v, d_out, "causal")
    assert all(torch.equal(a, b) for a, b in zip(autograd(), direct))
    monkeypatch.setenv(kernels.BACKEND_ENV, "triton")
    for a, b in zip(autograd(), direct):
        assert rel_frobenius_error(a.float().cpu(), b.float().cpu()) < REF_RTOL
