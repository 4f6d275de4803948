"""The context-parallel ring with the real Triton kernel per step, under Triton's CPU interpreter.

Run in a child process with TRITON_INTERPRET=1, as tests/cpu/triton_backend/
test_attention_interpreter.py does, with its caveats (fp32 -> float8e4nv casts are wrong there,
BF16 dots are garbage): FP16 inputs and Q quantized outside the kernel. What the interpreter
checks here: the launcher's kv_fp8 route (what a ring step receives) gives the bits of its own
quantization; the ring's LSE is the single call's (no P cast involved); with q = 0 (P exact even
under the interpreter) the ring's output is the single call's up to the partials' FP16 rounding;
future shards change no earlier output bitwise, and the global-amax V rule is caught. Values
with the real P cast are the GPU's to check (tests/pytorch/attention/
test_exact_fp8_context_parallel.py).
"""

import os
import subprocess
import sys

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":

    def test_ring_under_triton_interpreter():
        pytest.importorskip("triton")
        env = dict(os.environ, TRITON_INTERPRET="1")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-4000:]

else:
    import numpy as np
    import torch
    import triton.runtime.interpreter as triton_interpreter

    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import quantize
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.context_parallel import (
        payload as cp_payload,
        simulate,
        steps,
    )
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
        leaky_cp_quantizer,
        rel_frobenius_error,
    )
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton.attention import (
        exact_fp8_attention_forward,
    )

    if tuple(int(x) for x in np.__version__.split(".")[:2]) >= (2, 4):
        # As the kernel's interpreter tests do: Triton 3.6's interpreter takes int() of
        # 1-element arrays for loop bounds, an error since NumPy 2.4.
        _patch_tensor = triton_interpreter._patch_lang_tensor

        def _patched(tensor, scope):
            _patch_tensor(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

        triton_interpreter._patch_lang_tensor = _patched

    CP, S, B = 2, 512, 1  # chunks of 128 tokens

    def _q_fp8(q, recipe="current"):
        if recipe == "mxfp8":
            return quantize.per_block_cast_to_mxfp8_rowwise(q, qkv_format="bshd", backend="torch")
        return quantize.per_token_cast_to_fp8(q, qkv_format="bshd", backend="torch")

    def _inputs(seed):
        gen = torch.Generator().manual_seed(seed)
        return tuple(torch.randn(B, S, h, 64, generator=gen).half() for h in (2, 1, 1))

    def _ring(q, k, v, recipe="current", **kw):
        return simulate.simulate_forward(
            q, k, v, CP, recipe=recipe, causal=True, step_forward=steps.kernel_step_forward,
            q_fp8_of=lambda x: _q_fp8(x, recipe), backend="torch", **kw,
        )  # fmt: skip

    def _single(q, k, v, recipe="current"):
        return exact_fp8_attention_forward(q, k, v, recipe=recipe, q_fp8=_q_fp8(q, recipe))

    @pytest.mark.parametrize("recipe", ["current", "mxfp8"])
    def test_kv_fp8_route_gives_the_launchers_bits(recipe):
        q, k, v = _inputs(0)
        p = cp_payload.quantize_kv(k, v, rank=0, recipe=recipe, backend="torch")
        out, lse = exact_fp8_attention_forward(
            q, torch.zeros_like(k), v, recipe=recipe, q_fp8=_q_fp8(q, recipe), kv_fp8=p.kv_fp8
        )
        want_out, want_lse = _single(q, k, v, recipe)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)

    @pytest.mark.parametrize("recipe", ["current", "mxfp8"])
    def test_ring_lse_is_the_single_calls(recipe):
        q, k, v = _inputs(1)
        ring = _ring(q, k, v, recipe)
        _, lse = _single(q, k, v, recipe)
        torch.testing.assert_close(ring.lse, lse.view(2, B, S), rtol=0, atol=1e-5)

    def test_ring_output_is_the_single_calls_where_p_is_exact():
        q, k, v = _inputs(2)
        q = torch.zeros_like(q)
        ring = _ring(q, k, v)
        out, _ = _single(q, k, v)
        assert rel_frobenius_error(ring.out, out) < 2.0**-10

    def test_future_shards_change_nothing_and_global_amax_is_caught():
        t = 199  # inside chunk 1 (rank 1); global tokens 0..255 straddle ranks 0 and 1
        q, k, v = _inputs(3)
        q2, k2, v2 = (x.clone() for x in (q, k, v))
        gen = torch.Generator().manual_seed(4)
        for x in (q2, k2, v2):
            x[:, t + 1 :] = (
                (torch.randn(x[:, t + 1 :].shape, generator=gen) * 1e4).clamp(-6e4, 6e4).half()
            )
        base, pert = _ring(q, k, v), _ring(q2, k2, v2)
        assert torch.equal(base.out[:, : t + 1], pert.out[:, : t + 1])
        assert torch.equal(base.lse[..., : t + 1], pert.lse[..., : t + 1])
        leaky = [
            _ring(*xs, quantize=leaky_cp_quantizer("global-amax", xs[2], CP, "bshd"))
            for xs in ((q, k, v), (q, k, v2))
        ]
        assert not torch.equal(leaky[0].out[:, : t + 1], leaky[1].out[:, : t + 1])
