"""The context-parallel ring simulated in one process, every step through the fp64 oracle
(reference/context_parallel.py), against the single call; and the ring backward's decomposition.

Tolerances, reasoned (docs/context_parallel.md): a step quantizes nothing differently from the
single call (per-token Q/K scales; V chunks of 128 tokens that the load-balanced chunks, a
multiple of 128 long, never cut; the same FP8/unquantized decision per (query tile, KV tile)),
so the step LSEs merge to the single call's LSE up to the fp32 merge (1e-5 absolute). The
outputs differ by (a) P's E4M3 rounding, which is relative to each call's row max (a step's,
not the whole row's) and (b) each step's output rounded to the input dtype before the fp32
merge. (a) is noise of the size of the FP8 error itself: the ring's error against unquantized
attention must stay within 10% of the single call's. With q = 0 every P is exactly P_SCALE in
both, which removes (a): then the two differ by (b) alone, bf16 roundings of the partials and
of the result, relative 2^-8.

Exactness (bitwise, torch.equal): future shards and other samples never change an output, and
the leaky V rules of testing.LEAKY_CP_RULES are caught by the same checks.
"""

import pytest
import torch

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.context_parallel import (
    a2a,
    chunking,
    payload as cp_payload,
    simulate,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference import (
    quantize as ref_quantize,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.attention import (
    reference_attention,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.context_parallel import (
    reference_step_backward,
    reference_step_forward,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import SeqLayout
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
    LEAKY_CP_RULES,
    leaky_cp_quantizer,
    rel_frobenius_error,
)

L = chunking.CP_CHUNK_MULTIPLE


def _inputs(gen, cp_size, fmt="bshd", b=2, h=4, h_kv=2, d=64, dtype=torch.bfloat16):
    s = 2 * cp_size * L
    shape = (b, s) if fmt == "bshd" else (s, b)
    return tuple(
        torch.randn(*shape, heads, d, generator=gen).to(dtype) for heads in (h, h_kv, h_kv)
    )


def _ring(q, k, v, cp_size, recipe="current", causal=True, fmt="bshd", **kw):
    return simulate.simulate_forward(
        q, k, v, cp_size, recipe=recipe, causal=causal, qkv_format=fmt,
        step_forward=reference_step_forward, **kw,
    )  # fmt: skip


def _single(path, q, k, v, causal=True, fmt="bshd"):
    mask = "causal" if causal else "no_mask"
    return reference_attention(path, q, k, v, qkv_format=fmt, attn_mask_type=mask)


def _tokens(x, fmt):
    """[b, s, ...] whatever the format."""
    return x if fmt == "bshd" else x.transpose(0, 1)


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("recipe", ["current", "mxfp8"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("cp_size", [2, 3])
def test_ring_matches_single_call(fmt, recipe, causal, cp_size):
    gen = torch.Generator().manual_seed(cp_size)
    q, k, v = _inputs(gen, cp_size, fmt)
    ring = _ring(q, k, v, cp_size, recipe, causal, fmt)
    single = _single("fork-" + recipe, q, k, v, causal, fmt)
    exact = _single("bf16", q, k, v, causal, fmt)
    b, h = q.shape[fmt.index("b")], q.shape[2]
    torch.testing.assert_close(ring.lse.double(), single.lse.view(h, b, -1), rtol=0, atol=1e-5)
    err_ring = rel_frobenius_error(ring.out, exact.out)
    err_single = rel_frobenius_error(single.out, exact.out)
    assert err_ring <= 1.1 * err_single, (err_ring, err_single)
    assert rel_frobenius_error(ring.out, single.out) > 0  # it is a decomposition, not a copy


@pytest.mark.parametrize("recipe", ["current", "mxfp8"])
def test_ring_matches_single_call_where_p_is_exact(recipe):
    gen = torch.Generator().manual_seed(5)
    q, k, v = _inputs(gen, 2)
    q = torch.zeros_like(q)
    ring = _ring(q, k, v, 2, recipe)
    single = _single("fork-" + recipe, q, k, v)
    assert rel_frobenius_error(ring.out, single.out) < 2.0**-8


def _future_perturbed(x, t, fmt, gen, magnitude=3e4):
    """x with every position > t of every sample replaced by large finite values."""
    y = _tokens(x.clone(), fmt)
    noise = torch.randn(y[:, t + 1 :].shape, generator=gen) * magnitude
    y[:, t + 1 :] = noise.to(x.dtype)
    return y if fmt == "bshd" else y.transpose(0, 1)


def _prefix_equal(a, b, t, fmt):
    return torch.equal(_tokens(a, fmt)[:, : t + 1], _tokens(b, fmt)[:, : t + 1])


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("recipe", ["current", "mxfp8"])
@pytest.mark.parametrize("t", [L - 1, L + 72, 3 * L - 1])
def test_future_shards_change_no_earlier_output(fmt, recipe, t):
    """cp = 2, chunks of 128: positions > t (later chunks, on the same or the other rank) set to
    large finite values in q, k and v change no output or LSE at positions <= t, bitwise."""
    gen = torch.Generator().manual_seed(t)
    q, k, v = _inputs(gen, 2, fmt)
    q2, k2, v2 = (_future_perturbed(x, t, fmt, gen) for x in (q, k, v))
    base, pert = _ring(q, k, v, 2, recipe, fmt=fmt), _ring(q2, k2, v2, 2, recipe, fmt=fmt)
    assert _prefix_equal(base.out, pert.out, t, fmt)
    assert torch.equal(base.lse[..., : t + 1], pert.lse[..., : t + 1])
    assert not torch.equal(base.out, pert.out)  # the perturbation does reach later rows


@pytest.mark.parametrize("causal", [True, False])
def test_other_samples_change_nothing(causal):
    gen = torch.Generator().manual_seed(9)
    q, k, v = _inputs(gen, 2)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[1] = (torch.randn(x[1].shape, generator=gen) * 3e4).to(x.dtype)
    base = _ring(q, k, v, 2, causal=causal)
    pert = _ring(q2, k2, v2, 2, causal=causal)
    assert torch.equal(base.out[0], pert.out[0]) and torch.equal(base.lse[:, 0], pert.lse[:, 0])
    assert not torch.equal(base.out[1], pert.out[1])


@pytest.mark.parametrize("rule", LEAKY_CP_RULES)
def test_leaky_v_rules_are_caught(rule):
    """Negative controls: one V amax over all ranks, or a V scale whose chunk straddles two
    ranks' shards (global tokens 0..255 = chunk 0 on rank 0 and chunk 1 on rank 1), let a
    future V (position 200) change outputs at positions <= 199; the exact rule does not."""
    t = 199
    gen = torch.Generator().manual_seed(1)
    q, k, v = _inputs(gen, 2)
    v2 = v.clone()
    v2[:, t + 1] = 1e4
    changed = []
    for quantize in (None, leaky_cp_quantizer(rule, v, 2, "bshd")):
        base = _ring(q, k, v, 2, quantize=quantize)
        if quantize is not None:
            quantize = leaky_cp_quantizer(rule, v2, 2, "bshd")
        pert = _ring(q, k, v2, 2, quantize=quantize)
        changed.append(not _prefix_equal(base.out, pert.out, t, "bshd"))
    assert changed == [False, True], f"{rule}: exact changed / leaky changed = {changed}"


@pytest.mark.parametrize("recipe", ["current", "mxfp8"])
def test_payload_is_the_reference_quantization(recipe):
    """What travels is bit for bit the fork's rules (reference/quantize.py), and half the bytes
    of BF16 K and V (d = 128: 0.52x for current scaling)."""
    gen = torch.Generator().manual_seed(2)
    _, k, v = _inputs(gen, 2, d=128)
    p = cp_payload.quantize_kv(k, v, rank=0, recipe=recipe, backend="torch")
    k_deq, v_deq = p.received(p.wire()).dequantize()
    k_t, v_t = k.flatten(0, 1), v.flatten(0, 1)
    layout = SeqLayout.dense(k.shape[0], k.shape[1])
    if recipe == "current":
        kd, ks = ref_quantize.per_token_cast_to_fp8(k_t)
        vd, vs, _ = ref_quantize.per_chunk_cast_to_fp8(v_t, layout)
        want_k = ref_quantize.dequantize(kd, ks.unsqueeze(-1))
        want_v = ref_quantize.dequantize(
            vd, ref_quantize.expand_chunk_scales(vs, layout, L)[..., None]
        )
        assert p.nbytes() / (2 * k.numel() * k.element_size()) < 0.53
    else:
        want_k = ref_quantize.dequantize_mxfp8_rowwise(
            *ref_quantize.per_block_cast_to_mxfp8_rowwise(k_t)
        )
        vd, vs, _ = ref_quantize.per_chunk_cast_to_mxfp8_columnwise(v_t, layout)
        scales = ref_quantize.expand_chunk_scales(vs, layout, 32)
        want_v = vd.double() * ref_quantize.e8m0_to_float(scales).double()
    assert torch.equal(k_deq, want_k) and torch.equal(v_deq, want_v)


@pytest.mark.parametrize("recipe", ["current", "mxfp8"])
def test_a2a_heads_are_the_single_calls_heads(recipe):
    """a2a: a rank's heads over whole sequences are the single call's heads, bitwise."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = _inputs(gen, 2, h=4, h_kv=2)
    single = _single("fork-" + recipe, q, k, v)
    for rank in range(2):
        hq, hk = a2a.head_split(rank, 2, 4, 2)
        part = _single("fork-" + recipe, q[:, :, hq], k[:, :, hk], v[:, :, hk])
        assert torch.equal(part.out, single.out[:, :, hq])
        assert torch.equal(part.lse, single.lse[hq])


# ------------------------------------------------------------------------------ backward


def _exact_attention(q, k, v, causal):
    """fp64 attention [b, s, h, d] (GQA) under autograd, and its LSE [h, b, s]."""
    rep = q.shape[2] // k.shape[2]
    qh, kh, vh = (x.permute(0, 2, 1, 3) for x in (q, k, v))
    kh, vh = (x.repeat_interleave(rep, 1) for x in (kh, vh))
    s = qh @ kh.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = (torch.softmax(s, -1) @ vh).permute(0, 2, 1, 3)
    return out, lse.permute(1, 0, 2)


def _ring_grads(q, k, v, dout, cp_size, causal):
    out, lse = _exact_attention(q, k, v, causal)
    return simulate.simulate_backward(
        q, k, v, out.detach(), dout, lse.detach().float(), cp_size, causal=causal,
        step_backward=reference_step_backward,
    )  # fmt: skip


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("cp_size", [2, 3])
def test_ring_backward_is_the_gradient(causal, cp_size):
    """The ring backward's per-step gradients (merged LSE and output, dq kept, dk/dv travelling
    home) sum to autograd's gradients of the whole attention (fp64, up to the fp32 LSE and the
    fp32 accumulators)."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (x.double().requires_grad_() for x in _inputs(gen, cp_size, b=1, h=2, h_kv=1))
    dout = torch.randn(q.shape, generator=gen, dtype=torch.float64)
    out, _ = _exact_attention(q, k, v, causal)
    want = torch.autograd.grad(out, (q, k, v), dout)
    got = _ring_grads(q.detach(), k.detach(), v.detach(), dout, cp_size, causal)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-4)


def test_ring_backward_prefix_gradients_are_bitwise_invariant():
    """Loss over positions <= t: the ring's gradients at positions <= t do not change, bitwise,
    when every later position of q, k, v holds large finite values. Control: without the causal
    mask the later positions are visible, and the same check sees the gradients change."""
    t = L + 40
    gen = torch.Generator().manual_seed(6)
    q, k, v = (x.double() for x in _inputs(gen, 2, b=1, h=2, h_kv=1))
    dout = torch.randn(q.shape, generator=gen, dtype=torch.float64)
    dout[:, t + 1 :] = 0
    q2, k2, v2 = (_future_perturbed(x, t, "bshd", gen, magnitude=30.0) for x in (q, k, v))
    for causal in (True, False):
        base = _ring_grads(q, k, v, dout, 2, causal)
        pert = _ring_grads(q2, k2, v2, dout, 2, causal)
        same = [torch.equal(a[:, : t + 1], b[:, : t + 1]) for a, b in zip(base, pert)]
        assert same == ([True] * 3 if causal else [False] * 3), (causal, same)
