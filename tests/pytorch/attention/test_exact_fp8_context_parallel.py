"""Mask-exact FP8 attention under context parallelism on one GPU: the ring of TE's
AttnFuncWithCPAndKVP2P simulated in one process (context_parallel/simulate.py), every step
through the real Triton kernel (context_parallel/steps.py, kernels.attention_forward with the
step's mask and the src rank's FP8 K/V payload), against the single call.

Tolerances (docs/context_parallel.md): the steps quantize Q, K and V exactly as the single call
and take the same FP8/unquantized decision per tile, so the merged LSE is the single call's up to
the fp32 merge and the kernels' exp2/log2 (2e-5 absolute at these magnitudes); the outputs
differ by P's E4M3 rounding, relative to each call's running row max, and by the partials'
rounding to BF16: the ring's error against fp64 unquantized attention stays within 10% of the
single call's (plus 2^-10), and with q = 0 (P exact) the two agree to 2^-8 relative.
Exactness is bitwise: future shards and other samples change no output; the leaky V rules of
testing.LEAKY_CP_RULES must be caught. test_multi_gpu_ring launches run_exact_fp8_cp.py with
torchrun where two or more GPUs are visible (never run on hardware so far), and skips otherwise.
"""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import kernels
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.context_parallel import (
    a2a,
    payload as cp_payload,
    simulate,
    steps,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.attention import (
    reference_attention,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
    LEAKY_CP_RULES,
    leaky_cp_quantizer,
    rel_frobenius_error,
)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="mask-exact FP8 attention needs a GPU with FP8 tensor cores (sm89+)",
)

H, H_KV, D = 8, 2, 128


def _inputs(seed, cp_size, b=2, chunk=256, fmt="bshd"):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    s = 2 * cp_size * chunk
    lead = (b, s) if fmt == "bshd" else (s, b)
    return tuple(
        torch.randn(*lead, h, D, generator=gen, device="cuda").bfloat16() for h in (H, H_KV, H_KV)
    )


def _ring(q, k, v, cp_size, recipe="current", causal=True, fmt="bshd", **kw):
    return simulate.simulate_forward(
        q, k, v, cp_size, recipe=recipe, causal=causal, qkv_format=fmt,
        step_forward=steps.kernel_step_forward, **kw,
    )  # fmt: skip


def _single(q, k, v, recipe="current", causal=True, fmt="bshd"):
    mask = "causal" if causal else "no_mask"
    return kernels.attention_forward(q, k, v, recipe=recipe, qkv_format=fmt, attn_mask_type=mask)


def _tokens(x, fmt):
    return x if fmt == "bshd" else x.transpose(0, 1)


@pytest.mark.parametrize("recipe", ["current", "mxfp8"])
def test_kv_fp8_route_gives_the_launchers_bits(recipe):
    q, k, v = _inputs(0, 2)
    p = cp_payload.quantize_kv(k, v, rank=0, recipe=recipe)
    got = kernels.attention_forward(
        q, steps.stand_in(k.shape, k.dtype, "cuda", 0.0), v, recipe=recipe, kv_fp8=p.kv_fp8
    )
    # K/V arriving quantized run the Triton kernel (kernels.choose_backend): compare with it
    want = kernels.attention_forward(
        q, k, v, backend="triton", recipe=recipe, qkv_format="bshd", attn_mask_type="causal"
    )
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("recipe", ["current", "mxfp8"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("cp_size", [2, 4])
def test_ring_matches_single_call(fmt, recipe, causal, cp_size):
    q, k, v = _inputs(cp_size, cp_size, fmt=fmt)
    ring = _ring(q, k, v, cp_size, recipe, causal, fmt)
    out, lse = _single(q, k, v, recipe, causal, fmt)
    b, s = _tokens(q, fmt).shape[:2]
    torch.testing.assert_close(ring.lse, lse.view(H, b, s), rtol=0, atol=2e-5)
    mask = "causal" if causal else "no_mask"
    exact = reference_attention(
        "bf16", q.cpu(), k.cpu(), v.cpu(), qkv_format=fmt, attn_mask_type=mask
    ).out
    err_ring = rel_frobenius_error(ring.out.cpu(), exact)
    err_single = rel_frobenius_error(out.cpu(), exact)
    print(
        f"\n{fmt} {recipe} causal={causal} cp={cp_size}: error vs fp64 ring {err_ring:.3e}"
        f" single {err_single:.3e}, ring vs single {rel_frobenius_error(ring.out, out):.3e}"
    )
    assert err_ring <= 1.1 * err_single + 2.0**-10


@pytest.mark.parametrize("recipe", ["current", "mxfp8"])
def test_ring_matches_single_call_where_p_is_exact(recipe):
    q, k, v = _inputs(7, 2)
    q = torch.zeros_like(q)
    ring = _ring(q, k, v, 2, recipe)
    out, _ = _single(q, k, v, recipe)
    assert rel_frobenius_error(ring.out, out) < 2.0**-8


def _perturb_after(x, t, fmt, gen, magnitude=3e4):
    y = _tokens(x.clone(), fmt)
    y[:, t + 1 :] = (torch.randn(y[:, t + 1 :].shape, generator=gen, device="cuda") * magnitude).to(
        x.dtype
    )
    return y if fmt == "bshd" else y.transpose(0, 1)


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("recipe", ["current", "mxfp8"])
@pytest.mark.parametrize("t", [255, 300, 767, 1100, 1791])
def test_future_shards_change_no_earlier_output(fmt, recipe, t):
    """cp = 4, chunks of 256: every position > t (later chunks on this and other ranks) set to
    large finite BF16 values changes no output or LSE at positions <= t, bitwise."""
    q, k, v = _inputs(t, 4, fmt=fmt)
    gen = torch.Generator(device="cuda").manual_seed(t + 1)
    q2, k2, v2 = (_perturb_after(x, t, fmt, gen) for x in (q, k, v))
    base, pert = _ring(q, k, v, 4, recipe, fmt=fmt), _ring(q2, k2, v2, 4, recipe, fmt=fmt)
    assert torch.equal(_tokens(base.out, fmt)[:, : t + 1], _tokens(pert.out, fmt)[:, : t + 1])
    assert torch.equal(base.lse[..., : t + 1], pert.lse[..., : t + 1])
    assert not torch.equal(base.out, pert.out)


@pytest.mark.parametrize("causal", [True, False])
def test_other_samples_change_nothing(causal):
    q, k, v = _inputs(11, 2)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[1] = (torch.randn_like(x[1], dtype=torch.float32) * 3e4).bfloat16()
    base, pert = _ring(q, k, v, 2, causal=causal), _ring(q2, k2, v2, 2, causal=causal)
    assert torch.equal(base.out[0], pert.out[0]) and torch.equal(base.lse[:, 0], pert.lse[:, 0])


@pytest.mark.parametrize("rule", LEAKY_CP_RULES)
def test_leaky_v_rules_are_caught(rule):
    """Chunks of 128 tokens (cp = 2): a V scale over all ranks, or one per 256 global tokens
    (straddling chunk 0 on rank 0 and chunk 1 on rank 1), lets V[200] change rows <= 199."""
    t = 199
    q, k, v = _inputs(13, 2, chunk=128)
    v2 = v.clone()
    v2[:, t + 1] = 1e4
    changed = []
    for leaky in (False, True):
        quant = [leaky_cp_quantizer(rule, x, 2, "bshd") if leaky else None for x in (v, v2)]
        base = _ring(q, k, v, 2, quantize=quant[0])
        pert = _ring(q, k, v2, 2, quantize=quant[1])
        changed.append(not torch.equal(base.out[:, : t + 1], pert.out[:, : t + 1]))
    assert changed == [False, True], f"{rule}: exact / leaky changed = {changed}"


@pytest.mark.parametrize("recipe", ["current", "mxfp8"])
def test_a2a_heads_are_the_single_calls_heads(recipe):
    q, k, v = _inputs(17, 2)
    out, lse = _single(q, k, v, recipe)
    for rank in range(2):
        hq, hk = a2a.head_split(rank, 2, H, H_KV)
        part = [x[:, :, s].contiguous() for x, s in ((q, hq), (k, hk), (v, hk))]
        o, l = _single(*part, recipe)
        assert torch.equal(o, out[:, :, hq]) and torch.equal(l, lse[hq])


def test_payload_halves_the_ring_bytes():
    _, k, v = _inputs(19, 2)
    p = cp_payload.quantize_kv(k, v, rank=0, recipe="current")
    ratio = p.nbytes() / (k.numel() * k.element_size() + v.numel() * v.element_size())
    assert ratio < 0.53, ratio


def test_multi_gpu_ring():
    """run_exact_fp8_cp.py under torchrun, one process per GPU (two or more)."""
    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip("the multi-GPU ring needs two or more GPUs")
    torchrun = shutil.which("torchrun")
    cmd = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    script = os.path.join(os.path.dirname(__file__), "run_exact_fp8_cp.py")
    nproc = 4 if n >= 4 else 2
    cmd += ["--standalone", f"--nproc-per-node={nproc}", script]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
