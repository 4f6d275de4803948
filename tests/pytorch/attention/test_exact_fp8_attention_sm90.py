"""GPU tests of the sm_90a CUDA attention forward (exact_fp8/cuda/, the "cuda" kernel backend).

The kernel has not run on hardware before these tests: tools/gpu_sm90_check.sh builds it and runs
them first. They check, for the subset it implements (bshd, sbhd and thd, bf16 and fp16, d = 64
and 128, current scaling, every mask type with and without a sliding window, MHA and GQA):
- headline: bitwise invariance (torch.equal) of every output and LSE a mask hides from a
  perturbation (future Q, K and V with large finite values; other samples and sequences; keys
  outside a window; NaN, Inf and huge values in padding), with a visible perturbation as the
  control that must be seen;
- accuracy against the fp64 reference, within the bound the Triton kernel's test uses;
- agreement with the Triton kernel (the second implementation), within a stated tolerance.
"""

from typing import NamedTuple, Optional

import pytest
import torch

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import kernels, masks
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.cuda import attention
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.attention import (
    reference_attention,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
    HUGE_ROW_SCALES,
    negative_score_inputs,
    one_hot_self_scores,
    rel_frobenius_error,
)


def _skip_reason():
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if torch.cuda.get_device_capability() != (9, 0):
        return "the CUDA attention kernel is built for sm_90a (Hopper) only"
    if not attention.extension_has_kernel():
        return "transformer_engine_exact_fp8 was built without the sm_90a attention kernel"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))

MASKS = ("causal", "causal_bottom_right", "no_mask")
DTYPES = [torch.bfloat16, torch.float16]  # the inputs', V's (boundary tiles) and O's
# (b, s_q, s_kv, h, h_kv): tile-aligned and ragged lengths, one tile and several, MHA and GQA.
SHAPES = [
    (2, 128, 128, 4, 4),
    (2, 300, 300, 4, 2),
    (1, 1024, 1024, 2, 1),
    (2, 77, 200, 4, 4),
    (2, 384, 130, 4, 2),
]
BF16_MAX = 3.3895313892515355e38


def _inputs(seed, b, s_q, s_kv, h, h_kv, outliers=True, dtype=torch.bfloat16, d=128):
    """N(0, 1) in `dtype`, with x50 outliers (1%) when `outliers`; on the GPU; head dim d."""
    gen = torch.Generator().manual_seed(seed)

    def make(shape):
        x = torch.randn(*shape, generator=gen)
        if outliers:
            x = torch.where(torch.rand(*shape, generator=gen) < 0.01, 50 * x, x)
        return x.to(dtype).cuda()

    return make((b, s_q, h, d)), make((b, s_kv, h_kv, d)), make((b, s_kv, h_kv, d))


def _cuda(q, k, v, mask, **kw):
    return kernels.attention_forward(
        q, k, v, backend="cuda", recipe="current", qkv_format="bshd", attn_mask_type=mask, **kw
    )


def _triton(q, k, v, mask):
    pytest.importorskip("triton", reason="the comparison needs the Triton backend")
    return kernels.attention_forward(
        q, k, v, backend="triton", recipe="current", qkv_format="bshd", attn_mask_type=mask
    )


def test_backend_is_available_and_chosen_for_what_it_runs(monkeypatch):
    monkeypatch.delenv(kernels.BACKEND_ENV, raising=False)
    assert kernels.backend_available("cuda")
    assert kernels.select_backend() == "cuda"
    assert kernels.head_dims("cuda") == (64, 128)
    q, k, v = _inputs(0, 1, 128, 128, 2, 2)
    assert kernels.choose_backend(q, k, v, recipe="current", attn_mask_type="causal") == "cuda"
    # what the kernel does not run goes to the Triton kernel, never elsewhere
    kw = dict(recipe="mxfp8", attn_mask_type="padding_causal")
    assert kernels.choose_backend(q, k, v, **kw) == "triton"
    assert kernels.choose_backend(*(x[..., :64] for x in (q, k, v)), recipe="current") == "cuda"
    assert kernels.choose_backend(q.float(), k.float(), v.float(), recipe="current") == "triton"
    assert kernels.choose_backend(q.half(), k.half(), v.half(), recipe="current") == "cuda"
    monkeypatch.setenv(kernels.BACKEND_ENV, "triton")
    assert kernels.choose_backend(q, k, v, recipe="current", attn_mask_type="causal") == "triton"


# -------------------------------------------------------------------- exactness (headline)


def _future(x, t, value):
    """x with every position > t of every sample set to `value` (large finite)."""
    y = x.clone()
    y[:, t + 1 :] = value
    return y


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("t", [0, 100, 127, 128, 255, 300, 511])
@pytest.mark.parametrize("which", ["q", "k", "v", "qkv"])
@pytest.mark.parametrize("value", ["6e4", "-max", "max"])
def test_causal_future_changes_no_prefix_bit(t, which, value, dtype):
    """Causal: positions > t (large finite values in Q, K and/or V, up to the dtype's largest)
    never change a bit of the outputs or LSEs of rows <= t, on FP8 and boundary tiles alike, in
    bf16 and fp16."""
    largest = torch.finfo(dtype).max
    value = {"6e4": 6e4, "max": largest, "-max": -largest}[value]
    q, k, v = _inputs(1, 2, 640, 640, 4, 2, dtype=dtype)
    base_out, base_lse = _cuda(q, k, v, "causal")
    q2, k2, v2 = (_future(x, t, value) if name in which else x for name, x in zip("qkv", (q, k, v)))
    out, lse = _cuda(q2, k2, v2, "causal")
    assert torch.equal(out[:, : t + 1], base_out[:, : t + 1])
    lse_rows = torch.arange(640, device=q.device).repeat(2) <= t  # [b * s] token-major
    assert torch.equal(lse[:, lse_rows], base_lse[:, lse_rows])


@pytest.mark.parametrize("t", [0, 100, 200, 300, 500])
@pytest.mark.parametrize("value", [6e4, BF16_MAX])
def test_negative_control_the_leaky_variant_is_caught(t, value):
    """The negative control of the invariance tests, with a leaky rule: fp8_v_everywhere=True
    (E4M3 P and V8^T with its chunk scale on the diagonal tile too) lets large V values after t,
    inside t's own 128-key tile, change rows <= t; the mask-exact kernel on the same inputs
    changes none of their bits."""
    q, k, v = _inputs(10, 1, 512, 512, 2, 2, outliers=False)
    v2 = _future(v, t, value)
    exact, exact2 = (_cuda(q, k, x, "causal")[0] for x in (v, v2))
    assert torch.equal(exact2[:, : t + 1], exact[:, : t + 1])
    leaky, leaky2 = (_cuda(q, k, x, "causal", fp8_v_everywhere=True)[0] for x in (v, v2))
    assert not torch.equal(leaky2[:, : t + 1], leaky[:, : t + 1]), "the leak was not caught"


@pytest.mark.parametrize("mask", MASKS)
def test_leaky_variant_computes_attention(mask):
    """fp8_v_everywhere=True is still attention: it differs from the mask-exact kernel on the
    boundary tiles only, by E4M3 P and V there, i.e. by at most the rules' own FP8 error on
    those tiles' share of the output (3.4e-2 to 5e-2 relative on N(0, 1) inputs, and rows of the
    first query tile see boundary tiles only): bound 1e-1, where a wrong tile is off by O(1)."""
    q, k, v = _inputs(11, 2, 384, 384, 4, 2, outliers=False)
    exact, lse = _cuda(q, k, v, mask)
    leaky, lse_leaky = _cuda(q, k, v, mask, fp8_v_everywhere=True)
    assert rel_frobenius_error(leaky.float(), exact.float()) <= 1e-1
    assert torch.equal(lse_leaky, lse)  # the scores and the softmax do not involve V
    with pytest.raises(ValueError, match="s_kv not a multiple of 128"):
        _cuda(q[:, :300], k[:, :300], v[:, :300], mask, fp8_v_everywhere=True)


@pytest.mark.parametrize("t", [100, 300])
def test_control_a_visible_change_is_seen(t):
    """The negative control of the invariance tests: changing V at a position <= t (visible to
    row t) must change row t."""
    q, k, v = _inputs(2, 1, 512, 512, 2, 2, outliers=False)  # no weight underflows to 0
    base, _ = _cuda(q, k, v, "causal")
    v2 = v.clone()
    v2[:, t] = 100.0
    out, _ = _cuda(q, k, v2, "causal")
    assert not torch.equal(out[:, t], base[:, t])


@pytest.mark.parametrize("mask", MASKS)
def test_other_sample_changes_nothing(mask):
    """Batch isolation: sample 1 (any finite values, V scales 2^100 apart) never reaches sample 0."""
    q, k, v = _inputs(3, 2, 300, 300, 4, 2)
    base_out, base_lse = _cuda(q, k, v, mask)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    q2[1], k2[1], v2[1] = -BF16_MAX, 1e30, 3e38
    out, lse = _cuda(q2, k2, v2, mask)
    assert torch.equal(out[0], base_out[0])
    assert torch.equal(lse[:, :300], base_lse[:, :300])


# Many more query tiles than an H100/H200 has SMs (several waves of CTAs), GQA with 4 query heads
# per KV head, a ragged last tile.
MANY_TILES = (3, 1500, 16, 4)  # (b, s, h, h_kv): 576 query tiles


@pytest.mark.parametrize("t", [0, 700, 1023, 1499])
def test_many_tiles_future_changes_no_prefix_bit(t):
    b, s, h, h_kv = MANY_TILES
    q, k, v = _inputs(5, b, s, s, h, h_kv)
    base_out, base_lse = _cuda(q, k, v, "causal")
    q2, k2, v2 = (_future(x, t, BF16_MAX) for x in (q, k, v))
    out, lse = _cuda(q2, k2, v2, "causal")
    assert torch.equal(out[:, : t + 1], base_out[:, : t + 1])
    lse_rows = torch.arange(s, device=q.device).repeat(b) <= t
    assert torch.equal(lse[:, lse_rows], base_lse[:, lse_rows])


@pytest.mark.parametrize("mask", MASKS)
def test_many_tiles_agree_with_the_triton_kernel_and_isolate_samples(mask):
    """Every tile as the Triton kernel computes it, and sample 2's garbage never reaches
    samples 0 and 1. Tolerance 2.5e-2: test_agrees_with_the_triton_kernel's bound (half
    the rules' error to fp64, 3.4e-2 to 5e-2 on N(0, 1) inputs, + 2^-8) without its fp64
    reference at this size; a tile computed from another tile's state is off by O(1)."""
    b, s, h, h_kv = MANY_TILES
    q, k, v = _inputs(6, b, s, s, h, h_kv, outliers=False)
    out, lse = _cuda(q, k, v, mask)
    out_t, lse_t = _triton(q, k, v, mask)
    assert rel_frobenius_error(out.float(), out_t.float()) <= 2.5e-2
    torch.testing.assert_close(lse, lse_t, rtol=2.0**-10, atol=2.0**-8)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    q2[2], k2[2], v2[2] = -BF16_MAX, 1e30, 3e38
    out2, lse2 = _cuda(q2, k2, v2, mask)
    assert torch.equal(out2[:2], out[:2])
    assert torch.equal(lse2[:, : 2 * s], lse[:, : 2 * s])


def test_calls_are_deterministic():
    q, k, v = _inputs(4, 2, 700, 700, 4, 1)
    a = _cuda(q, k, v, "causal")
    b = _cuda(q, k, v, "causal")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def _assert_same_bits(got, want):
    """Each (out, lse) of `got` equals the one of `want` bit for bit."""
    assert len(got) == len(want)
    for (out, lse), (want_out, want_lse) in zip(got, want):
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_forwards_on_two_streams_equal_the_same_calls_in_turn():
    """Forwards running at the same time on two streams give the bits of the same calls made one
    after the other, and so do the launches after them (a kernel that keeps launch state in
    device memory, such as a persistent grid's tile counter, must keep concurrent launches
    apart and leave it clean)."""
    inputs = [_inputs(seed, 1, 2048, 2048, 8, 8) for seed in (40, 41)]
    want = [_cuda(*x, "causal") for x in inputs]
    streams = [torch.cuda.Stream() for _ in inputs]
    for _ in range(3):
        got = []
        for stream, x in zip(streams, inputs):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                got.append(_cuda(*x, "causal"))
        for stream in streams:
            torch.cuda.current_stream().wait_stream(stream)
        _assert_same_bits(got, want)
    _assert_same_bits([_cuda(*x, "causal") for x in inputs], want)


@pytest.mark.parametrize("ctas", [1, 3])
def test_few_ctas_walking_many_tiles_give_the_same_bits(monkeypatch, ctas):
    """The persistent grid capped at `ctas` CTAs (NVTE_EXACT_FP8_SM90_FWD_MAX_CTAS), so that each
    walks many query tiles through one KV ring (boundary and FP8 tiles, a window's, the tail
    visits of padded and thd sequences, GQA, d = 64 and 128): the bits of the full grid."""
    cases = [
        _dense_case(50, 700, 650, None, None, "causal"),
        _dense_case(51, 520, 520, [520, 200], [520, 77], "padding_causal"),
        _dense_case(52, 640, 640, None, None, "causal", window=(200, 0)),
        _thd_case(53, [300, 129, 1, 640], [300, 200, 1, 640], "padding_causal", pads=[5, 0, 3, 1]),
    ]
    d64 = _inputs(54, 1, 300, 300, 2, 1, d=64)
    want = [_forward(case, "cuda") for case in cases] + [_cuda(*d64, "no_mask")]
    monkeypatch.setenv("NVTE_EXACT_FP8_SM90_FWD_MAX_CTAS", str(ctas))
    got = [_forward(case, "cuda") for case in cases] + [_cuda(*d64, "no_mask")]
    _assert_same_bits(got, want)


# -------------------------------------------------------------------- accuracy


def _assert_within_fp64_bound(out, q, k, v, mask):
    """The Triton kernel's bound (test_exact_fp8_attention.py::test_accuracy_against_fp64) on a
    bshd call: relative Frobenius error of `out` vs the unquantized fp64 reference <= 1.5x the
    error of the fork's rules in fp64 ("fork-current", rules v2) + one bf16 ulp. Returns the two
    references (CPU)."""
    q_c, k_c, v_c = (x.cpu() for x in (q, k, v))
    kw = dict(qkv_format="bshd", attn_mask_type=mask)
    truth = reference_attention("bf16", q_c, k_c, v_c, **kw)
    fork = reference_attention("fork-current", q_c, k_c, v_c, **kw)
    err = rel_frobenius_error(out.cpu(), truth.out)
    ref_err = rel_frobenius_error(fork.out, truth.out)
    assert err <= 1.5 * ref_err + 2.0**-8, f"error {err:.3e} vs the reference rules' {ref_err:.3e}"
    return truth, fork


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_accuracy_against_fp64(mask, shape, dtype):
    """The Triton kernel's bound (test_exact_fp8_attention.py::test_accuracy_against_fp64):
    relative Frobenius error vs the unquantized fp64 reference <= 1.5x the error of the fork's
    rules in fp64 ("fork-current", rules v2) + one bf16 ulp; LSE within 2^-8 relative of the
    rules' LSE; rows that see nothing give 0 and -inf. fp16: the boundary tiles' V, their P and
    O in fp16 (the Triton kernel's fp16 path), the same bounds."""
    q, k, v = _inputs(5, *shape, dtype=dtype)
    out, lse = _cuda(q, k, v, mask)
    assert out.dtype == dtype and out.shape == q.shape
    truth, fork = _assert_within_fp64_bound(out, q, k, v, mask)
    finite = torch.isfinite(truth.lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    torch.testing.assert_close(
        lse.cpu()[finite].double(), fork.lse[finite], rtol=2.0**-8, atol=2.0**-6
    )


@pytest.mark.parametrize("mask", MASKS)
def test_accuracy_of_long_rows_with_a_common_v_offset(mask):
    """Note [Two-level P.V accumulation]: with V ~ N(4, 1) every tile adds the same sign to the
    running numerator, which a WGMMA accumulator holds with only ~13-14 bits; rows of 32 KV
    tiles (s = 4k) then lost 4e-2 relative to fp64 in the kernel that accumulated across tiles
    inside the WGMMA (its negative control: 4.3e-2 measured against the 3.1e-3 this test sees).
    Same bound as test_accuracy_against_fp64: <= 1.5x the rules' own fp64 error + 2^-8."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 4096, 2, 128, generator=gen) for _ in range(3))
    q, k, v = q.bfloat16().cuda(), k.bfloat16().cuda(), (v + 4.0).bfloat16().cuda()
    out, _ = _cuda(q, k, v, mask)
    _assert_within_fp64_bound(out, q, k, v, mask)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_agrees_with_the_triton_kernel(mask, shape, dtype):
    """Both kernels apply the same rules (v2) in the same tile order; they differ in rounding
    only (the Triton kernel splits boundary tiles into BOUNDARY_N sub-tiles, the online softmax
    steps differ there, and the two compilers order the fp32 arithmetic differently). Stated
    tolerance, on N(0, 1) inputs without outliers: ||cuda - triton|| / ||triton|| <= half the
    rules' own error to the fp64 truth + one bf16 ulp; the LSEs (no V in them) agree within
    2^-10 relative."""
    q, k, v = _inputs(6, *shape, outliers=False, dtype=dtype)
    out, lse = _cuda(q, k, v, mask)
    out_t, lse_t = _triton(q, k, v, mask)
    q_c, k_c, v_c = (x.cpu() for x in (q, k, v))
    kw = dict(qkv_format="bshd", attn_mask_type=mask)
    truth = reference_attention("bf16", q_c, k_c, v_c, **kw)
    fork = reference_attention("fork-current", q_c, k_c, v_c, **kw)
    ref_err = rel_frobenius_error(fork.out, truth.out)
    diff = rel_frobenius_error(out.cpu(), out_t.cpu())
    bound = 0.5 * ref_err + 2.0**-8
    assert diff <= bound, f"CUDA vs Triton {diff:.3e} > {bound:.3e} (rules' error {ref_err:.3e})"
    finite = torch.isfinite(lse_t)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse[finite], lse_t[finite], rtol=2.0**-10, atol=2.0**-8)


@pytest.mark.parametrize("leaky", [False, True])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize(
    "shape", SHAPES + [(3, 100, 203, 4, 2)], ids=lambda s: "x".join(map(str, s))
)
def test_one_call_forward_equals_the_casts_then_the_kernel(shape, mask, leaky):
    """forward_supported's single extension call (attention_sm90_fwd_quantizing: the casts into
    a workspace, then the kernel) gives the bytes of quantize_operands followed by launch, for
    strided Q and K views too, aligned V8^T layouts (batch > 1, s_kv % 16 != 0) and the leaky
    variant (s_kv a multiple of 128)."""
    if leaky and shape[2] % 128:
        pytest.skip("the leaky variant runs s_kv a multiple of 128 only")
    b, s_q, s_kv, h, h_kv = shape
    q, k, v = _inputs(12, *shape)
    # Q and K as views of packed tensors (non-contiguous, d contiguous).
    q = torch.cat([q, torch.zeros_like(q)], dim=-1)[..., :128]
    k = torch.stack([k, v], dim=2)[:, :, 0]
    kw = dict(qkv_format="bshd", use_power_2_scales=True, amax_epsilon=0.0)
    one_call = _cuda(q, k, v, mask, use_power_2_scales=True, fp8_v_everywhere=leaky)
    ops = attention.quantize_operands(q, k, v, **kw)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(h, b * s_q, dtype=torch.float32, device="cuda")
    attention.launch(ops, out, lse, attention._MASK_CODES[mask], 128**-0.5, leaky)
    assert torch.equal(one_call[0], out) and torch.equal(one_call[1], lse)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", [(2, 200, 203, 4, 2), (1, 256, 256, 2, 2)], ids=str)
def test_cuda_graph_replay_equals_eager(mask, shape):
    """A captured forward (the casts into a workspace of the graph's pool, the dense offsets
    made inside the capture, the kernel), replayed on new inputs, gives the eager call's bits."""
    static = list(_inputs(14, *shape))
    _cuda(*static, mask)  # warm: per-shape caches and the kernel attributes outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = _cuda(*static, mask)
    for seed in (15, 16):
        fresh = _inputs(seed, *shape)
        for buffer, x in zip(static, fresh):
            buffer.copy_(x)
        graph.replay()
        want_out, want_lse = _cuda(*fresh, mask)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_head_dim_strided_inputs_equal_their_contiguous_copies():
    """Q and K whose head dim is not contiguous (stride 2) are copied for the casts: the same
    bytes as the contiguous inputs."""
    q, k, v = _inputs(13, 2, 200, 200, 4, 2)
    q_s = torch.stack([q, q], dim=-1)[..., 0]
    k_s = torch.stack([k, k], dim=-1)[..., 0]
    assert q_s.stride(-1) == 2 and k_s.stride(-1) == 2
    a = _cuda(q_s, k_s, v, "causal")
    b = _cuda(q, k, v, "causal")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_no_keys_gives_zero_and_minus_inf():
    q, _, _ = _inputs(7, 2, 130, 1, 2, 2)
    k = torch.empty(2, 0, 2, 128, dtype=torch.bfloat16, device="cuda")
    out, lse = _cuda(q, k, k.clone(), "no_mask")
    assert not out.any() and torch.isneginf(lse).all()


# -------------------------------------------------------------------- sbhd


def _sbhd(*xs):
    return tuple(x.transpose(0, 1).contiguous() for x in xs)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", [(2, 300, 300, 4, 2), (2, 77, 200, 4, 4)], ids=str)
def test_sbhd_runs_the_kernel_and_equals_bshd_bit_for_bit(mask, shape):
    """An sbhd call takes the CUDA kernel (on bshd views, cuda/attention.py): its O is the bshd
    call's O transposed and its LSE the bshd call's, bit for bit."""
    q, k, v = _inputs(31, *shape)
    out, lse = _cuda(q, k, v, mask)
    qs, ks, vs = _sbhd(q, k, v)
    kw = dict(recipe="current", qkv_format="sbhd", attn_mask_type=mask)
    assert kernels.choose_backend(qs, ks, vs, **kw) == "cuda"
    out_s, lse_s = kernels.attention_forward(qs, ks, vs, backend="cuda", **kw)
    assert out_s.shape == qs.shape and out_s.is_contiguous()
    assert torch.equal(out_s.transpose(0, 1), out) and torch.equal(lse_s, lse)


@pytest.mark.parametrize("t", [0, 135, 299])
def test_sbhd_causal_future_changes_no_prefix_bit(t):
    q, k, v = _sbhd(*_inputs(32, 2, 300, 300, 4, 2))
    kw = dict(backend="cuda", recipe="current", qkv_format="sbhd", attn_mask_type="causal")
    out, lse = kernels.attention_forward(q, k, v, **kw)

    def future(x):  # sbhd: positions after t along dim 0
        y = x.clone()
        y[t + 1 :] = BF16_MAX
        return y

    out2, lse2 = kernels.attention_forward(future(q), future(k), future(v), **kw)
    assert torch.equal(out2[: t + 1], out[: t + 1])
    rows = lambda x: x.view(x.shape[0], 2, 300)[:, :, : t + 1]  # lse [h, b * s]
    assert torch.equal(rows(lse2), rows(lse))


@pytest.mark.parametrize("t", [0, 150, 299])
@pytest.mark.parametrize("s_kv", [640, 300, 200])
def test_bottom_right_hidden_keys_change_no_prefix_bit(t, s_kv):
    """causal_bottom_right (row i sees keys j <= i + s_kv - s_q): the keys after t + s_kv - s_q
    and the queries after t, set to bf16's largest value, change no bit of rows <= t; with
    s_q > s_kv the first rows see nothing (O 0, LSE -inf) whatever the other rows hold."""
    s_q, off = 300, s_kv - 300
    q, k, v = _inputs(33, 2, s_q, s_kv, 4, 2)
    kw = dict(backend="cuda", recipe="current", attn_mask_type="causal_bottom_right")
    out, lse = kernels.attention_forward(q, k, v, **kw)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    q2[:, t + 1 :] = BF16_MAX
    if t + off + 1 < s_kv:
        k2[:, max(t + off + 1, 0) :] = BF16_MAX
        v2[:, max(t + off + 1, 0) :] = BF16_MAX
    out2, lse2 = kernels.attention_forward(q2, k2, v2, **kw)
    assert torch.equal(out2[:, : t + 1], out[:, : t + 1])
    rows = lambda x: x.view(x.shape[0], 2, s_q)[:, :, : t + 1]  # lse [h, b * s]
    assert torch.equal(rows(lse2), rows(lse))
    blind = max(-off, 0)  # rows that see no key
    assert (out[:, :blind] == 0).all() and (lse.view(4, 2, s_q)[:, :, :blind] == -torch.inf).all()


# -------------------------------------------------------------------- padding, thd, windows


class _Case(NamedTuple):
    """One call with sequences or a window: q, k, v on the GPU, the forward's keyword arguments
    (`kw`), the reference's (`ref_kw`: None where it has no equivalent, a padded thd pack), and
    which query and key tokens are real (token-major, the rest padding)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kw: dict
    ref_kw: Optional[dict]
    real_q: torch.Tensor  # [t_q] bool
    real_kv: torch.Tensor  # [t_kv] bool


def _cu(lengths):
    return torch.tensor([0] + list(lengths)).cumsum(0).int()


def _dense_case(seed, s_q, s_kv, lens_q, lens_kv, mask, window=None, dtype=torch.bfloat16):
    """bshd samples of s_q / s_kv tokens with real lengths lens_* (a padding mask), or every
    token real (lens_* None)."""
    b = len(lens_q) if lens_q is not None else 2
    q, k, v = _inputs(seed, b, s_q, s_kv, 4, 2, outliers=False, dtype=dtype)
    kw = dict(qkv_format="bshd", attn_mask_type=mask, window_size=window)
    ref_kw = dict(kw)
    if lens_q is not None:
        kw.update(cu_seqlens_q=_cu(lens_q).cuda(), cu_seqlens_kv=_cu(lens_kv).cuda())
        ref_kw.update(seqlens_q=list(lens_q), seqlens_kv=list(lens_kv))
    lens_q = lens_q or [s_q] * b
    lens_kv = lens_kv or [s_kv] * b
    real_q = (torch.arange(s_q).view(1, -1) < torch.tensor(lens_q).view(-1, 1)).flatten()
    real_kv = (torch.arange(s_kv).view(1, -1) < torch.tensor(lens_kv).view(-1, 1)).flatten()
    return _Case(q, k, v, kw, ref_kw, real_q, real_kv)


def _thd_case(seed, lens_q, lens_kv, mask, pads=None, window=None, dtype=torch.bfloat16):
    """A thd pack of sequences with real lengths lens_*, each followed by pads[n] padding tokens
    (cu_seqlens_*_padded) when pads is given."""
    pads = pads or [0] * len(lens_q)
    span_q = [a + p for a, p in zip(lens_q, pads)]
    span_kv = [a + p for a, p in zip(lens_kv, pads)]
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(sum(span), h, 128, generator=gen).to(dtype).cuda()
        for span, h in ((span_q, 4), (span_kv, 2), (span_kv, 2))
    )
    kw = dict(
        qkv_format="thd", attn_mask_type=mask, window_size=window,
        cu_seqlens_q=_cu(lens_q).cuda(), cu_seqlens_kv=_cu(lens_kv).cuda(),
    )  # fmt: skip
    ref_kw = None if any(pads) else dict(kw, cu_seqlens_q=_cu(lens_q), cu_seqlens_kv=_cu(lens_kv))
    if any(pads):
        kw.update(cu_seqlens_q_padded=_cu(span_q).cuda(), cu_seqlens_kv_padded=_cu(span_kv).cuda())
    real = lambda lens, spans: torch.cat(
        [torch.arange(sp) < n for n, sp in zip(lens, spans)]
    )  # fmt: skip
    return _Case(q, k, v, kw, ref_kw, real(lens_q, span_q), real(lens_kv, span_kv))


SEQUENCE_CASES = {
    "bshd-padding_causal": lambda d: _dense_case(40, 300, 300, [300, 173, 1], [300, 173, 1],
                                                 "padding_causal", dtype=d),
    "bshd-padding": lambda d: _dense_case(41, 200, 300, [200, 77], [300, 129], "padding", dtype=d),
    "bshd-padding_causal_bottom_right": lambda d: _dense_case(
        42, 256, 300, [120, 250], [300, 140], "padding_causal_bottom_right", dtype=d
    ),
    "thd-padding_causal": lambda d: _thd_case(43, [300, 1, 200], [300, 1, 200],
                                              "padding_causal", dtype=d),
    "thd-padding-cross": lambda d: _thd_case(44, [130, 64, 257], [300, 5, 128], "padding", dtype=d),
    "thd-padded-allocation": lambda d: _thd_case(
        45, [200, 129, 7], [200, 129, 7], "padding_causal", pads=[56, 1, 300], dtype=d
    ),
    "window-causal": lambda d: _dense_case(46, 700, 700, None, None, "causal", (128, 0), dtype=d),
    "window-two-sided": lambda d: _dense_case(47, 500, 500, None, None, "no_mask", (100, 37),
                                              dtype=d),
    "window-bottom-right": lambda d: _dense_case(48, 300, 640, None, None, "causal_bottom_right",
                                                 (300, 0), dtype=d),
    "thd-window": lambda d: _thd_case(49, [700, 130], [700, 130], "padding_causal", window=(200, 0),
                                      dtype=d),
}  # fmt: skip


def _tokens(x, case):
    """x (q-shaped: out) token-major [t, h, d]."""
    return x if case.kw["qkv_format"] == "thd" else x.flatten(0, 1)


def _forward(case, backend, q=None, k=None, v=None):
    q, k, v = (
        (case.q if q is None else q),
        (case.k if k is None else k),
        (case.v if v is None else v),
    )
    return kernels.attention_forward(q, k, v, backend=backend, recipe="current", **case.kw)


def test_sequences_and_windows_run_the_cuda_kernel(monkeypatch):
    monkeypatch.delenv(kernels.BACKEND_ENV, raising=False)
    for name, make in SEQUENCE_CASES.items():
        case = make(torch.bfloat16)
        chosen = kernels.choose_backend(case.q, case.k, case.v, recipe="current", **case.kw)
        assert chosen == "cuda", name


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(SEQUENCE_CASES))
def test_sequences_and_windows_agree_with_the_triton_kernel_and_fp64(name, dtype):
    """Padding masks, thd packs (with and without padded allocations) and sliding windows: real
    rows within test_agrees_with_the_triton_kernel's tolerance of the Triton kernel (half the
    rules' own error to fp64 + 2^-8, or 2.5e-2 where the reference has no padded thd) and within
    test_accuracy_against_fp64's bound of the fp64 truth; padding rows and rows that see nothing
    are 0 and LSE -inf in both kernels."""
    pytest.importorskip("triton", reason="the comparison needs the Triton backend")
    case = SEQUENCE_CASES[name](dtype)
    out, lse = _forward(case, "cuda")
    out_t, lse_t = _forward(case, "triton")
    assert out.shape == case.q.shape and out.dtype == dtype
    rows, rows_t = _tokens(out, case).cpu(), _tokens(out_t, case).cpu()
    pad = ~case.real_q
    assert (rows[pad] == 0).all() and (lse[:, pad.cuda()] == -torch.inf).all()
    finite = torch.isfinite(lse_t)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse[finite], lse_t[finite], rtol=2.0**-10, atol=2.0**-8)
    real = case.real_q
    if case.ref_kw is None:
        assert rel_frobenius_error(rows[real], rows_t[real]) <= 2.5e-2
        return
    q_c, k_c, v_c = (x.cpu() for x in (case.q, case.k, case.v))
    truth = reference_attention("bf16", q_c, k_c, v_c, **case.ref_kw)
    fork = reference_attention("fork-current", q_c, k_c, v_c, **case.ref_kw)
    truth_rows, fork_rows = _tokens(truth.out, case)[real], _tokens(fork.out, case)[real]
    ref_err = rel_frobenius_error(fork_rows, truth_rows)
    diff = rel_frobenius_error(rows[real], rows_t[real])
    assert diff <= 0.5 * ref_err + 2.0**-8, f"CUDA vs Triton {diff:.3e} (rules' {ref_err:.3e})"
    err = rel_frobenius_error(rows[real], truth_rows)
    assert err <= 1.5 * ref_err + 2.0**-8, f"error {err:.3e} vs the rules' {ref_err:.3e}"


GARBAGE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "max": BF16_MAX}


@pytest.mark.parametrize("garbage", list(GARBAGE) + ["random-large"])
@pytest.mark.parametrize(
    "name", ["bshd-padding_causal", "bshd-padding", "thd-padded-allocation", "thd-window"]
)
def test_padding_garbage_changes_no_output_bit(name, garbage):
    """Whatever the padded positions of Q, K and V hold (NaN, Inf, bf16's largest value, random
    large values), no bit of a real row's output or LSE changes, and padding rows stay 0 / -inf:
    the kernel never reads padding into a real row (V of the tile past a sequence's last key is
    zeroed before its P . V, mainloop.h zero_v_tail)."""
    case = SEQUENCE_CASES[name](torch.bfloat16)
    out, lse = _forward(case, "cuda")
    gen = torch.Generator().manual_seed(50)

    def spoil(x, real):
        tokens = _tokens(x, case).clone()
        if garbage == "random-large":
            noise = torch.randn(tokens.shape, generator=gen) * 2.0 ** torch.randint(
                10, 120, tokens.shape, generator=gen
            )
            fill = noise.clamp(-BF16_MAX, BF16_MAX).to(x.dtype).cuda()
        else:
            fill = torch.full_like(tokens, GARBAGE[garbage])
        pad = ~real.cuda()
        tokens[pad] = fill[pad]
        return tokens.view(x.shape)

    q2 = spoil(case.q, case.real_q)
    k2, v2 = spoil(case.k, case.real_kv), spoil(case.v, case.real_kv)
    out2, lse2 = _forward(case, "cuda", q2, k2, v2)
    assert torch.equal(out2, out), "a padded position changed an output bit"
    assert torch.equal(lse2, lse)
    assert (_tokens(out2, case)[~case.real_q.cuda()] == 0).all()


# Real key counts whose last KV tile ends at every position of a 16-key group, in the first and
# the second KV tile: zero_v_tail zeroes 128-byte rows of the swizzled V tile, and the rows of
# keys 8 .. 15 of a group are where a wrong swizzle domain once put other keys' rows.
TAIL_LENGTHS = [n for n in range(1, 17)] + [128 + n for n in range(1, 17)]


@pytest.mark.parametrize("fmt", ["bshd", "thd"])
@pytest.mark.parametrize("mask", ["padding", "padding_causal"])
def test_every_tail_length_keeps_real_keys_and_drops_padding(mask, fmt):
    """For a last KV tile of every length mod 16 (TAIL_LENGTHS, one sequence each): NaN in every
    padded position changes no bit of a real row (the tail's V zeroed past the last key), and a
    real key near the end of its sequence (the 16 last ones, one at a time) changes exactly the
    rows that see it (its V row is not zeroed with the padding). Agreement tests cannot see one
    missing key among a hundred: this one does."""
    lens = TAIL_LENGTHS
    s = max(lens) + 16
    if fmt == "bshd":
        case = _dense_case(63, s, s, lens, lens, mask)
    else:
        case = _thd_case(63, lens, lens, mask, pads=[16] * len(lens))
    out, lse = _forward(case, "cuda")
    nan_v = _tokens(case.v, case).masked_fill(~case.real_kv.cuda().view(-1, 1, 1), float("nan"))
    out2, lse2 = _forward(case, "cuda", v=nan_v.view(case.v.shape))
    assert torch.equal(out2, out) and torch.equal(lse2, lse), "padded V reached a real row"

    spans = [s] * len(lens) if fmt == "bshd" else [n + 16 for n in lens]
    starts = [sum(spans[:i]) for i in range(len(lens))]  # each sequence's first token
    rows_of = [torch.arange(n) + starts[i] for i, n in enumerate(lens)]
    for back in range(1, 17):  # key len - back of every sequence at once
        keys = [starts[i] + n - back for i, n in enumerate(lens) if n >= back]
        v2 = _tokens(case.v, case).clone()
        v2[keys] += 64.0
        out3 = _tokens(_forward(case, "cuda", v=v2.view(case.v.shape))[0], case)
        changed = (out3 != _tokens(out, case)).flatten(1).any(1).cpu()
        for i, n in enumerate(lens):
            if n < back:
                continue
            rows = rows_of[i]
            sees = torch.ones(n, dtype=torch.bool) if mask == "padding" else (
                torch.arange(n) >= n - back
            )  # fmt: skip
            assert torch.equal(changed[rows], sees), (fmt, mask, n, back)


# Dense geometries for the per-key test below: (mask, window, s_q, s_kv, head dim).
KEY_GEOMETRIES = {
    "causal": ("causal", None, 300, 300, 128),
    "causal-bottom-right": ("causal_bottom_right", None, 200, 330, 128),
    "no-mask": ("no_mask", None, 260, 300, 128),
    "causal-window": ("causal", (128, 0), 400, 400, 128),
    "two-sided-window": ("no_mask", (100, 37), 300, 300, 128),
    "causal-d64": ("causal", None, 300, 300, 64),
}


@pytest.mark.parametrize("name", list(KEY_GEOMETRIES))
def test_each_key_changes_exactly_the_rows_that_see_it(name):
    """Keys at every kind of tile edge (the first and last of a KV tile, the diagonal's, the
    sequence's last), one at a time with V raised by 64: the rows that see the key (masks.py's
    rule) change, and no other row changes by a bit. Both directions at once: a row that misses
    a key it sees, or reads one it does not, fails here, where an agreement tolerance would not
    notice one key among hundreds."""
    mask, window, s_q, s_kv, d = KEY_GEOMETRIES[name]
    q, k, v = _inputs(64, 1, s_q, s_kv, 4, 2, outliers=False, d=d)
    kw = dict(window_size=window) if window is not None else {}
    out, _ = _cuda(q, k, v, mask, **kw)
    seen = masks.allowed_positions(mask, window, s_q, s_kv)  # [s_q, s_kv]
    edges = {0, 1, 63, 64, 127, 128, 129, 255, 256, s_kv - 2, s_kv - 1}
    for j in sorted(x for x in edges if 0 <= x < s_kv):
        v2 = v.clone()
        v2[:, j] += 64.0
        out2, _ = _cuda(q, k, v2, mask, **kw)
        changed = (out2 != out)[0].flatten(1).any(1).cpu()  # [s_q]
        assert torch.equal(changed, seen[:, j]), (name, j)


@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("d", [128, 64])
def test_a_nan_in_q_or_k_makes_exactly_the_rows_that_see_it_nan(backend, d):
    """A NaN in one channel of a query's Q, or of a key's K (each key of a 16-key group in turn,
    so that it lands in every register slot of a thread's scores; on the diagonal's boundary tile
    for rows 128-255 and on FP8 tiles for the rows after): every output and the LSE of the rows
    that see it are NaN, as in BF16 attention (a NaN row sum is not a row that sees nothing),
    and no other row changes a bit."""
    q, k, v = _inputs(65, 1, 640, 640, 2, 1, outliers=False, d=d)

    def forward(q, k):
        out, lse = {"cuda": _cuda, "triton": _triton}[backend](q, k, v, "causal")
        return out[0], lse  # [s, h, d], [h, s]

    out, _ = forward(q, k)
    seen = masks.allowed_positions("causal", None, 640, 640)  # [s_q, s_kv]
    cases = [("k", j, seen[:, j]) for j in range(128, 144)]
    cases += [("q", i, torch.arange(640) == i) for i in (0, 130, 255, 256, 639)]
    for which, pos, rows in cases:
        q2, k2 = q.clone(), k.clone()
        (q2 if which == "q" else k2)[:, pos, :, 5] = float("nan")
        out2, lse2 = forward(q2, k2)
        assert torch.equal(out2.isnan().flatten(1).all(1).cpu(), rows), (which, pos)
        assert torch.equal(lse2.isnan().all(0).cpu(), rows), (which, pos)
        blind = ~rows.cuda()
        assert torch.equal(out2[blind], out[blind]), (which, pos)


@pytest.mark.parametrize("name", ["window-causal", "window-two-sided", "window-bottom-right"])
@pytest.mark.parametrize("seed", range(4))
def test_keys_outside_the_window_change_no_bit(name, seed):
    """A key j set to bf16's largest value (K and V) changes no bit of the rows whose window
    excludes it, on both sides of the window (the left edge's tiles are boundary tiles: their V
    is the unquantized one, so j's value enters no chunk scale those rows read)."""
    case = SEQUENCE_CASES[name](torch.bfloat16)
    s_q, s_kv = case.q.shape[1], case.k.shape[1]
    left, right = case.kw["window_size"]
    right = 0 if "causal" in case.kw["attn_mask_type"] else right
    diag = 0 if case.kw["attn_mask_type"] == "causal" else s_kv - s_q
    i = torch.arange(s_q).view(-1, 1)
    seen = (torch.arange(s_kv) >= i + diag - left) & (torch.arange(s_kv) <= i + diag + right)
    # keys that some rows see and others do not
    candidates = torch.nonzero((seen.sum(0) > 0) & (seen.sum(0) < s_q)).flatten()
    gen = torch.Generator().manual_seed(seed)
    j = int(candidates[torch.randint(0, candidates.numel(), (1,), generator=gen)])
    out, lse = _forward(case, "cuda")
    k2, v2 = case.k.clone(), case.v.clone()
    k2[:, j], v2[:, j] = BF16_MAX, BF16_MAX
    out2, lse2 = _forward(case, "cuda", k=k2, v=v2)
    sees = seen[:, j]
    hidden = ~sees
    assert torch.equal(out2[:, hidden.cuda()], out[:, hidden.cuda()])
    rows = lambda x: x.view(x.shape[0], -1, s_q)[:, :, hidden.cuda()]  # lse [h, b * s_q]
    assert torch.equal(rows(lse2), rows(lse))
    assert not torch.equal(out2[:, sees.cuda()], out[:, sees.cuda()])  # control: j is seen


@pytest.mark.parametrize("name", ["thd-padding_causal", "thd-padding-cross", "thd-window"])
def test_thd_sequences_are_isolated(name):
    """Every token of sequence 1 (any finite values, V scales far apart) changes no bit of the
    other sequences' outputs and LSEs."""
    case = SEQUENCE_CASES[name](torch.bfloat16)
    cu_q, cu_kv = case.kw["cu_seqlens_q"].tolist(), case.kw["cu_seqlens_kv"].tolist()
    out, lse = _forward(case, "cuda")
    q2, k2, v2 = case.q.clone(), case.k.clone(), case.v.clone()
    q2[cu_q[1] : cu_q[2]] = -BF16_MAX
    k2[cu_kv[1] : cu_kv[2]] = 1e30
    v2[cu_kv[1] : cu_kv[2]] = 3e38
    out2, lse2 = _forward(case, "cuda", q2, k2, v2)
    other = torch.ones(case.q.shape[0], dtype=torch.bool, device="cuda")
    other[cu_q[1] : cu_q[2]] = False
    assert torch.equal(out2[other], out[other])
    assert torch.equal(lse2[:, other], lse[:, other])


# -------------------------------------------------------------------- d = 64

D64_SHAPES = [(2, 300, 300, 4, 2), (1, 1024, 1024, 2, 1), (2, 77, 200, 4, 4)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", D64_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_d64_accuracy_and_agreement_with_the_triton_kernel(mask, shape, dtype):
    """d = 64 (Q8 and K8 rows of 64 bytes, a 64-column P.V): test_accuracy_against_fp64's bound
    against the fp64 truth and test_agrees_with_the_triton_kernel's tolerance against the
    Triton kernel, on inputs without outliers."""
    pytest.importorskip("triton", reason="the comparison needs the Triton backend")
    q, k, v = _inputs(60, *shape, outliers=False, dtype=dtype, d=64)
    out, lse = _cuda(q, k, v, mask)
    out_t, lse_t = _triton(q, k, v, mask)
    assert out.shape == q.shape and out.dtype == dtype
    q_c, k_c, v_c = (x.cpu() for x in (q, k, v))
    kw = dict(qkv_format="bshd", attn_mask_type=mask)
    truth = reference_attention("bf16", q_c, k_c, v_c, **kw)
    fork = reference_attention("fork-current", q_c, k_c, v_c, **kw)
    ref_err = rel_frobenius_error(fork.out, truth.out)
    err = rel_frobenius_error(out.cpu(), truth.out)
    assert err <= 1.5 * ref_err + 2.0**-8, f"error {err:.3e} vs the rules' {ref_err:.3e}"
    diff = rel_frobenius_error(out.cpu(), out_t.cpu())
    assert diff <= 0.5 * ref_err + 2.0**-8, f"CUDA vs Triton {diff:.3e} (rules' {ref_err:.3e})"
    finite = torch.isfinite(lse_t)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse[finite], lse_t[finite], rtol=2.0**-10, atol=2.0**-8)


@pytest.mark.parametrize("t", [0, 100, 255, 300])
@pytest.mark.parametrize("mask", ["causal", "causal_bottom_right"])
def test_d64_future_changes_no_prefix_bit(t, mask):
    q, k, v = _inputs(61, 2, 400, 400, 4, 2, d=64)
    out, lse = _cuda(q, k, v, mask)
    q2, k2, v2 = (_future(x, t, BF16_MAX) for x in (q, k, v))
    out2, lse2 = _cuda(q2, k2, v2, mask)
    assert torch.equal(out2[:, : t + 1], out[:, : t + 1])
    rows = lambda x: x.view(x.shape[0], 2, 400)[:, :, : t + 1]  # lse [h, b * s]
    assert torch.equal(rows(lse2), rows(lse))


@pytest.mark.parametrize("garbage", ["nan", "inf", "max"])
def test_d64_thd_padding_garbage_changes_no_output_bit(garbage):
    """A padded thd pack at d = 64 (the tail V zeroed in its one 128-byte row per key)."""
    case = _thd_case(62, [200, 129, 7], [200, 129, 7], "padding_causal", pads=[56, 1, 300])
    case = case._replace(q=case.q[..., :64].contiguous(), k=case.k[..., :64].contiguous(),
                         v=case.v[..., :64].contiguous())  # fmt: skip
    out, lse = _forward(case, "cuda")
    fill = lambda x, real: x.masked_fill(~real.cuda().view(-1, 1, 1), GARBAGE[garbage])
    q2 = fill(case.q, case.real_q)
    k2, v2 = fill(case.k, case.real_kv), fill(case.v, case.real_kv)
    out2, lse2 = _forward(case, "cuda", q2, k2, v2)
    assert torch.equal(out2, out) and torch.equal(lse2, lse)
    assert (out2[~case.real_q.cuda()] == 0).all()


# -------------------------------------------------------------------- fp16


@pytest.mark.parametrize("mask", ["causal", "no_mask"])  # the CUDA backward's masks
def test_fp16_sbhd_equals_bshd_and_runs_the_cuda_backward(mask):
    """An fp16 sbhd call runs the CUDA forward (bit for bit the bshd call's) and the CUDA
    backward, whose gradients are finite fp16."""
    q, k, v = _inputs(43, 2, 300, 300, 4, 2, dtype=torch.float16)
    out, lse = _cuda(q, k, v, mask)
    qs, ks, vs = _sbhd(q, k, v)
    kw = dict(recipe="current", qkv_format="sbhd", attn_mask_type=mask)
    assert kernels.choose_backend(qs, ks, vs, **kw) == "cuda"
    out_s, lse_s = kernels.attention_forward(qs, ks, vs, backend="cuda", **kw)
    assert torch.equal(out_s.transpose(0, 1), out) and torch.equal(lse_s, lse)
    assert kernels.choose_backward_backend(qs, ks, vs, **kw) == "cuda"
    grads = kernels.attention_backward(qs, ks, vs, out_s, torch.ones_like(out_s), lse_s, **kw)
    assert all(torch.isfinite(g).all() and g.dtype == torch.float16 for g in grads)


# -------------------------------------------------------------------- what is not supported


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(recipe="mxfp8"), "recipe 'mxfp8'"),
        (dict(attn_mask_type="padding_causal", fp8_v_everywhere=True), "leaky variant"),
        (dict(window_size=(64, 0), fp8_v_everywhere=True), "leaky variant"),
        (dict(qkv_format="thd"), "thd needs cu_seqlens_q and cu_seqlens_kv"),
    ],
)
def test_unsupported_calls_raise(change, match):
    q, k, v = _inputs(8, 2, 128, 128, 2, 2)
    kw = dict(recipe="current", qkv_format="bshd", attn_mask_type="causal")
    kw.update(change)
    with pytest.raises(ValueError, match=match):
        kernels.attention_forward(q, k, v, backend="cuda", **kw)


def test_unsupported_dtype_and_head_dim_raise():
    q, k, v = _inputs(9, 1, 128, 128, 2, 2)
    with pytest.raises(ValueError, match="bf16 or fp16, all three alike"):
        _cuda(q.float(), k.float(), v.float(), "causal")
    with pytest.raises(ValueError, match="bf16 or fp16, all three alike"):
        _cuda(q, k.half(), v, "causal")
    with pytest.raises(ValueError, match="leaky variant"):
        _cuda(q.half(), k.half(), v.half(), "causal", fp8_v_everywhere=True)
    with pytest.raises(ValueError, match="head dim 96"):
        _cuda(q[..., :96], k[..., :96], v[..., :96], "causal")
    with pytest.raises(ValueError, match="leaky variant"):
        _cuda(q[..., :64], k[..., :64], v[..., :64], "causal", fp8_v_everywhere=True)


@pytest.mark.parametrize("scale", list(HUGE_ROW_SCALES), ids=list(HUGE_ROW_SCALES.values()))
@pytest.mark.parametrize("shape", [(2, 300, 4), (1, 1024, 2)], ids=str)
def test_huge_scores_one_hot_rows_give_exactly_v(scale, shape):
    """Rows whose scores reach 2^10 .. 2^33 in log2 units (testing.one_hot_self_scores: Q = K,
    the softmax one-hot on the diagonal): the output is exactly V and the LSE finite. The
    one-FFMA exponent alone gave P8 of the max off 256 from ~2^20, saturated from 2^23, NaN beyond
    ~2^31; huge rows (softmax.h, kHugeRow) subtract the max in the score domain."""
    b, s, h = shape
    qk, v = one_hot_self_scores(11, b, s, h, 128, scale)
    out, lse = _cuda(qk.cuda(), qk.cuda(), v.cuda(), "causal")
    assert torch.equal(out.cpu(), v)
    assert torch.isfinite(lse).all()


@pytest.mark.parametrize("t", [100, 135, 200, 700])
def test_huge_future_rows_change_no_earlier_bit(t):
    """Rows after t with scores of ~2^33 (huge rows) share warps with rows <= t of ~2^10 (a warp
    holds 16 consecutive rows): no bit of rows <= t changes against a run where every row is of
    ~2^10. The huge-row decision is each row's own; the warp's choice of loop changes no bit."""
    qk, v = one_hot_self_scores(12, 2, 1024, 4, 128, 8.0)
    qk, v = qk.cuda(), v.cuda()
    base_out, base_lse = _cuda(qk, qk, v, "causal")
    qk2 = qk.clone()
    qk2[:, t + 1 :] *= 23170.0 / 8.0
    out, lse = _cuda(qk2, qk2, v, "causal")
    assert torch.equal(out[:, : t + 1], base_out[:, : t + 1])
    rows = torch.arange(1024, device=lse.device).repeat(2) <= t  # [b * s] token-major
    assert torch.equal(lse[:, rows], base_lse[:, rows])


def _negative_rows(seed, b, s, h, negative):
    """testing.negative_score_inputs [b, s, h, 128] on the GPU: the scores of the rows `negative`
    ([s] bool) all negative, of either sign elsewhere."""
    return tuple(x.cuda() for x in negative_score_inputs((b, s, h, 128), negative, seed))


@pytest.mark.parametrize("mask", ["no_mask", "causal"])
@pytest.mark.parametrize("t", [100, 135, 700])
def test_rows_with_only_negative_scores_change_no_other_row_bit(mask, t):
    """Note [Row maxima from the scores' bits] (softmax.h): an FP8 visit takes its row maxima
    from the largest of the scores' bit patterns, and a warp with a row whose scores are all
    negative so far also takes the smallest. Rows after t with only negative scores share warps
    with ordinary rows <= t (a warp holds 16 consecutive rows): no bit of rows <= t changes
    against a run where no row is negative. Changing Q rows changes no other row in any mask."""
    s = 1024
    rows = torch.arange(s)
    q, k, v = _negative_rows(13, 2, s, 4, rows < 0)
    base_out, base_lse = _cuda(q, k, v, mask)
    q2, _, _ = _negative_rows(13, 2, s, 4, rows > t)
    out, lse = _cuda(q2, k, v, mask)
    assert not torch.equal(out[:, t + 1 :], base_out[:, t + 1 :])  # the control: they changed
    assert torch.equal(out[:, : t + 1], base_out[:, : t + 1])
    kept = (rows <= t).repeat(2).to(lse.device)  # [b * s] token-major
    assert torch.equal(lse[:, kept], base_lse[:, kept])


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("pattern", ["all", "every-third", "first-half"])
def test_accuracy_of_rows_with_only_negative_scores(mask, pattern):
    """Rows whose scores are all negative (the smallest bit patterns of Note [Row maxima from
    the scores' bits]) beside ordinary ones: the bound of test_accuracy_against_fp64, <= 1.5x
    the rules' own fp64 error + 2^-8 (the running max of such a row stays negative, so a wrong
    choice of the maxima would give it a max of -inf or below its scores: an error of order 1)."""
    s = 640
    rows = torch.arange(s)
    negative = {"all": rows >= 0, "every-third": rows % 3 != 0, "first-half": rows < s // 2}
    q, k, v = _negative_rows(14, 1, s, 2, negative[pattern])
    out, lse = _cuda(q, k, v, mask)
    truth, fork = _assert_within_fp64_bound(out, q, k, v, mask)
    finite = torch.isfinite(truth.lse)
    torch.testing.assert_close(
        lse.cpu()[finite].double(), fork.lse[finite], rtol=2.0**-8, atol=2.0**-6
    )
