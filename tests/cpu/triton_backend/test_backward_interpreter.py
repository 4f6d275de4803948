"""The mask-exact FP8 attention backward kernels under Triton's CPU interpreter (TRITON_INTERPRET=1).

What the interpreter can check (docs/backward.md, docs/attention_kernel.md): FP8 (e4m3), FP16 and
FP32 tl.dot are exact there, BF16 dots are garbage and fp32 -> float8e4nv casts wrong. The
backward casts nothing to FP8 in-kernel (its launcher quantizes Q and K through quantize.py, the
reference rules on the CPU), so with FP16 inputs everything it computes is faithful. The cases
use small block sizes (BLOCK_CONFIG) so that short sequences walk many blocks, and check:

  * the backward's block walks (masking.row_block_ranges / column_block_ranges) against
    masks.allowed_positions, exhaustively over random geometries;
  * the gradients against the fp64 reference of the same straight-through math
    (reference/backward.py): masks, windows, layouts, GQA/MQA, padding, thd with gaps, both
    recipes, d 64 and 128, the production block sizes too;
  * bitwise invariance (torch.equal) of the prefix gradients of a loss over rows <= t under
    perturbations of Q, K, V after t (random values up to fp16's max, x10..x1e4 scalings, the
    largest finite fp16 value); of the real gradients under padding garbage (random, NaN, Inf,
    65504, in Q, K, V, dO, O and the LSE); of one sample's / one thd sequence's gradients under
    changes of another; outside a sliding window; and under a forward that overflowed on the
    rows after t (NaN O and LSE there);
  * rows that see nothing get zero gradients, never NaN;
  * negative controls that must be caught: the leaky emulation of the backward this replaced
    (unguarded=True: scores of the dequantized operands, no clamp, masks by multiplication,
    padding loaded).

The bf16 path, the launch configurations' speed and the in-kernel numerics of the GPU are the GPU
tests' (tests/pytorch/attention/test_exact_fp8_backward.py).
"""

import os

import pytest

from triton_interpreter_support import index_scalars_with_numpy_2_4, run_under_interpreter

if os.environ.get("TRITON_INTERPRET") != "1":

    def test_backward_kernels_under_triton_interpreter():
        run_under_interpreter(__file__)

else:
    import torch
    import triton
    import triton.language as tl

    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import (
        MASK_TYPES,
        allowed_positions,
        to_tokens,
    )
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
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton import (
        masking as kernel_masking,
    )
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton.attention import (
        exact_fp8_attention_forward,
    )
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton.backward import (
        exact_fp8_attention_backward,
    )
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import quantize

    index_scalars_with_numpy_2_4()

    RECIPES = ("current", "mxfp8")
    BLOCK_CONFIG = ((16, 32, 4, 1), (32, 16, 4, 1))  # (dK/dV, dQ) blocks: many per sequence
    FP16_MAX = 65504.0

    GRAD_RTOL = 2e-3
    """Relative Frobenius error of the kernel's gradients against the fp64 reference of the same
    math, FP16 inputs. The kernel rounds P, dS and the dequantized Q, K to fp16 for its MMAs
    (unit roundoff 2^-11 = 4.9e-4 each), accumulates in fp32 and reads the LSE in fp32; the
    errors are independent across the summed terms, so the normwise error stays near one
    roundoff (measured 2.8e-4 to 3.5e-4 on N(0, 1) inputs). 2e-3 is four roundoffs; a wrong
    scale, mask or layout gives errors of order 1."""

    # ------------------------------------------------------------------ helpers

    def _cu(lens):
        return torch.tensor([0] + list(lens)).cumsum(0).int()

    def _randn(gen, *shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).half()

    def _reference_forward(recipe, q, k, v, kw):
        """(out, lse) of the forward by the reference rules (exact where the interpreter's
        FP8 cast of P is not); no keys: zero output, LSE -inf."""
        if k.numel() == 0:
            t_q = q.shape[0] * q.shape[1]
            return torch.zeros_like(q), torch.full((q.shape[-2], t_q), float("-inf"))
        ref_kw = dict(qkv_format=kw["qkv_format"], attn_mask_type=kw["attn_mask_type"])
        ref_kw["window_size"] = kw.get("window_size")
        for side in ("q", "kv"):
            cu = kw.get(f"cu_seqlens_{side}")
            if cu is not None:
                key = f"seqlens_{side}" if kw["qkv_format"] != "thd" else f"cu_seqlens_{side}"
                ref_kw[key] = (cu[1:] - cu[:-1]).tolist() if key.startswith("seqlens") else cu
        result = reference_attention("fork-" + recipe, q, k, v, **ref_kw)
        return result.out, result.lse.float()

    def _backward(recipe, q, k, v, out, d_out, lse, kw, **extra):
        extra.setdefault("launch_config", BLOCK_CONFIG)
        return exact_fp8_attention_backward(q, k, v, out, d_out, lse, recipe=recipe, **kw, **extra)

    def _grads(recipe, q, k, v, d_out, kw, **extra):
        out, lse = _reference_forward(recipe, q, k, v, kw)
        return _backward(recipe, q, k, v, out, d_out, lse, kw, **extra)

    def _changed(base, pert, keep_q, keep_kv, fmt):
        """Elements of dq (rows keep_q) and dk, dv (positions keep_kv) that differ bitwise."""
        total = 0
        for a, b, keep in zip(base, pert, (keep_q, keep_kv, keep_kv)):
            total += prefix_change(to_tokens(a, fmt), to_tokens(b, fmt), keep)[1]
        return total

    # ------------------------------------------------------------------ block walks

    @triton.jit
    def _block_ranges_kernel(GEOM, OUT, N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        offs = tl.arange(0, N)
        n0, m0, len_q, len_kv, diag, left, right = (tl.load(GEOM + offs * 7 + i) for i in range(7))
        rows = kernel_masking.row_block_ranges(n0, len_q, len_kv, diag, left, right, BM, BN)
        cols = kernel_masking.column_block_ranges(m0, len_q, len_kv, diag, left, right, BM, BN)
        for i in tl.static_range(4):
            tl.store(OUT + offs * 8 + i, rows[i])
            tl.store(OUT + offs * 8 + 4 + i, cols[i])

    def _kernel_sides(mask, window, len_q, len_kv):
        left, right = window if window is not None else (-1, -1)
        right = 0 if "causal" in mask else right
        diag = 0 if mask in ("causal", "padding_causal") else len_kv - len_q
        return [diag] + [kernel_masking.UNBOUNDED if x < 0 else x for x in (left, right)]

    def _walk(pad, start, bm, bn, axis):
        """axis 0: the row blocks of bm rows against the columns [start, start + bn); axis 1:
        the column blocks of bn columns against the rows [start, start + bm). Per block:
        (some pair visible, every pair of a complete bm x bn block visible)."""
        step = bm if axis == 0 else bn
        some, full = [], []
        for blk in range(-(-pad.shape[axis] // step)):
            lo = blk * step
            if axis == 0:
                sub = pad[lo : lo + bm, start : start + bn]
            else:
                sub = pad[start : start + bm, lo : lo + bn]
            some.append(bool(sub.any()))
            full.append(tuple(sub.shape) == (bm, bn) and bool(sub.all()))
        return some, full

    @pytest.mark.parametrize("bm,bn", [(16, 32), (64, 128), (32, 16)])
    def test_block_walks_match_allowed_positions(bm, bn):
        """For a key block, the row blocks walked (and which need no mask) are exactly those
        with a visible pair (with every pair visible); likewise for a query block's column
        blocks. Over every mask type, windows and random lengths."""
        gen = torch.Generator().manual_seed(1)
        rows, want = [], []
        for mask in MASK_TYPES:
            for _ in range(20):
                len_q, len_kv = (int(x) for x in torch.randint(0, 300, (2,), generator=gen))
                sides = torch.randint(-1, 150, (2,), generator=gen).tolist()
                window = None if len(rows) % 3 == 0 else tuple(sides)
                # the allocation is longer than the real lengths: padding sees nothing
                pad = allowed_positions(mask, window, len_q, len_kv, len_q + 40, len_kv + 40)
                n0 = int(torch.randint(0, len_kv + 40, (1,), generator=gen)) // bn * bn
                m0 = int(torch.randint(0, len_q + 40, (1,), generator=gen)) // bm * bm
                geo = (n0, m0, len_q, len_kv, *_kernel_sides(mask, window, len_q, len_kv))
                want.append((_walk(pad, n0, bm, bn, 0), _walk(pad, m0, bm, bn, 1)))
                rows.append(geo)
        n = triton.next_power_of_2(len(rows))
        geom = torch.zeros(n, 7, dtype=torch.int32)
        geom[: len(rows)] = torch.tensor(rows, dtype=torch.int32)
        out = torch.empty(n, 8, dtype=torch.int32)
        _block_ranges_kernel[(1,)](geom, out, N=n, BM=bm, BN=bn)
        for geo, (row_blocks, col_blocks), got in zip(rows, want, out.tolist()):
            for (some, full), (lo, full_lo, full_hi, hi), size in (
                (row_blocks, got[:4], bm),
                (col_blocks, got[4:], bn),
            ):
                walked = [lo <= b * size < hi for b in range(len(some))]
                unmasked = [full_lo <= b * size < full_hi for b in range(len(some))]
                assert walked == some, geo
                assert unmasked == full, geo
                assert lo % size == full_lo % size == full_hi % size == hi % size == 0, geo

    # ------------------------------------------------------------------ values

    CASES = [
        dict(qkv_format="bshd", attn_mask_type="causal"),
        dict(qkv_format="sbhd", attn_mask_type="causal_bottom_right", s=(70, 100)),
        dict(qkv_format="bshd", attn_mask_type="no_mask", window_size=(20, 9)),
        dict(qkv_format="bshd", attn_mask_type="causal", window_size=(33, 0), heads=(4, 1)),
        dict(qkv_format="bshd", attn_mask_type="padding", lens=([90, 3], [100, 51])),
        dict(qkv_format="sbhd", attn_mask_type="padding_causal", lens=([100, 37], [100, 37])),
        dict(
            qkv_format="bshd",
            attn_mask_type="padding_causal_bottom_right",
            lens=([30, 100], [95, 61]),
        ),
        dict(qkv_format="bshd", attn_mask_type="no_mask", s=(80, 0)),  # no keys at all
    ]

    def _case(case, gen, d=64):
        """(q, k, v, d_out, kernel kwargs) of a dense case."""
        case = dict(case)
        fmt = case["qkv_format"]
        s_q, s_kv = case.get("s", (100, 100))
        h, h_kv = case.get("heads", (4, 2))
        lead = (lambda s: (2, s)) if fmt == "bshd" else (lambda s: (s, 2))
        q, d_out = (_randn(gen, *lead(s_q), h, d) for _ in range(2))
        k, v = (_randn(gen, *lead(s_kv), h_kv, d) for _ in range(2))
        kw = dict(qkv_format=fmt, attn_mask_type=case["attn_mask_type"])
        kw["window_size"] = case.get("window_size")
        if "lens" in case:
            kw["cu_seqlens_q"], kw["cu_seqlens_kv"] = (_cu(x) for x in case["lens"])
        return q, k, v, d_out, kw

    def _assert_close_to_reference(recipe, q, k, v, d_out, kw, grads, out):
        ref = reference_attention_backward(recipe, q, k, v, out, d_out, **kw)
        for name, g, r in zip("qkv", grads, ref):
            assert g.shape == r.shape and g.dtype == q.dtype, name
            assert torch.isfinite(g).all(), name
            if r.numel() == 0 or r.abs().max() == 0:
                assert not g.any(), name
            else:
                err = rel_frobenius_error(g, r)
                assert err < GRAD_RTOL, f"d{name}: relative error {err:.2e}"

    @pytest.mark.parametrize("recipe", RECIPES)
    @pytest.mark.parametrize(
        "case", CASES, ids=lambda c: f"{c['qkv_format']}-{c['attn_mask_type']}-{len(c)}"
    )
    def test_gradients_match_reference(recipe, case):
        q, k, v, d_out, kw = _case(case, torch.Generator().manual_seed(2))
        out, lse = _reference_forward(recipe, q, k, v, kw)
        grads = _backward(recipe, q, k, v, out, d_out, lse, kw)
        _assert_close_to_reference(recipe, q, k, v, d_out, kw, grads, out)
        if "cu_seqlens_q" in kw:  # padding positions get zero gradients
            lens_q = (kw["cu_seqlens_q"][1:] - kw["cu_seqlens_q"][:-1]).tolist()
            lens_kv = (kw["cu_seqlens_kv"][1:] - kw["cu_seqlens_kv"][:-1]).tolist()
            s_dim = 1 if kw["qkv_format"] == "bshd" else 0
            for g, lens in zip(grads, (lens_q, lens_kv, lens_kv)):
                for b, n in enumerate(lens):
                    pad = g.select(1 - s_dim, b).narrow(0, n, g.shape[s_dim] - n)
                    assert not pad.any()

    @pytest.mark.parametrize("recipe", RECIPES)
    def test_production_blocks_and_head_dim_128(recipe):
        """LAUNCH_CONFIG's block sizes (d 64 and 128) give the reference's gradients."""
        gen = torch.Generator().manual_seed(3)
        for d in (64, 128):
            case = dict(qkv_format="bshd", attn_mask_type="padding_causal")
            q, k, v, d_out, kw = _case(dict(case, s=(200, 200), lens=([200, 150],) * 2), gen, d)
            out, lse = _reference_forward(recipe, q, k, v, kw)
            grads = _backward(recipe, q, k, v, out, d_out, lse, kw, launch_config=None)
            _assert_close_to_reference(recipe, q, k, v, d_out, kw, grads, out)

    def _thd(gen, lens, gaps, garbage=float("nan")):
        """thd pack with `gaps` garbage tokens after each sequence: (q, k, v, d_out, out, lse
        of the gapped pack, kwargs, real token mask). The forward is the reference's over the
        sequences without gaps, spread into the pack (garbage in the gaps, LSE NaN)."""
        cu, cu_pad = _cu(lens), _cu([n + g for n, g in zip(lens, gaps)])
        t, t_pad = int(cu[-1]), int(cu_pad[-1])
        real = torch.zeros(t_pad, dtype=torch.bool)
        for start, n in zip(cu_pad[:-1].tolist(), lens):
            real[start : start + n] = True
        dense = [_randn(gen, t, h, 64) for h in (4, 2, 2, 4)]
        kw = dict(qkv_format="thd", attn_mask_type="padding_causal", cu_seqlens_q=cu)
        kw["cu_seqlens_kv"] = cu
        out, lse = _reference_forward("current", *dense[:3], kw)

        def spread(x, fill):
            full = torch.full((t_pad,) + x.shape[1:], fill, dtype=x.dtype)
            full[real] = x
            return full

        packed = [spread(x, garbage) for x in dense + [out]]
        lse_pad = torch.full((lse.shape[0], t_pad), float("nan"))
        lse_pad[:, real] = lse
        kw = dict(kw, cu_seqlens_q_padded=cu_pad, cu_seqlens_kv_padded=cu_pad)
        return (*packed, lse_pad, kw, real)

    def test_thd_with_gaps_matches_reference_and_zeroes_the_gaps():
        gen = torch.Generator().manual_seed(4)
        q, k, v, d_out, out, lse, kw, real = _thd(gen, [70, 1, 45], [9, 0, 20])
        grads = _backward("current", q, k, v, out, d_out, lse, kw, max_seqlen_q=70)
        clean = [torch.where(real[:, None, None], x, 0.0) for x in (q, k, v, out, d_out)]
        ref = reference_attention_backward("current", *clean, **kw)
        for g, r in zip(grads, ref):
            assert not g[~real].any() and torch.isfinite(g).all()
            assert rel_frobenius_error(g[real], r[real]) < GRAD_RTOL

    # ------------------------------------------------------------------ invariance, bitwise

    def _future(x, t, dim, values):
        """x with the positions after t along `dim` replaced by `values` (broadcast)."""
        y = x.clone()
        y.narrow(dim, t + 1, x.shape[dim] - t - 1).copy_(values)
        return y

    PERTURBATIONS = {
        # name: values(gen, shape) in fp16; all finite
        "random-max": lambda gen, shape: (torch.rand(shape, generator=gen) * 2 - 1) * FP16_MAX,
        "x10": lambda gen, shape: torch.randn(shape, generator=gen) * 10,
        "x1e2": lambda gen, shape: torch.randn(shape, generator=gen) * 1e2,
        "x1e4": lambda gen, shape: (torch.randn(shape, generator=gen) * 1e4).clamp(
            -FP16_MAX, FP16_MAX
        ),
        "max-finite": lambda gen, shape: torch.full(shape, FP16_MAX),
    }

    def _prefix_change(recipe, name, unguarded=False, mask="causal", which="qkv"):
        """Changed prefix gradient elements when Q, K, V after t = 60 turn to the
        perturbation's values; the loss is over rows <= t (dO = 0 after t)."""
        gen = torch.Generator().manual_seed(5)
        b, s, h, h_kv, d, t = 1, 128, 2, 1, 64, 60
        q, k, v = (_randn(gen, b, s, n, d) for n in (h, h_kv, h_kv))
        d_out = _future(_randn(gen, b, s, h, d), t, 1, torch.zeros(()))
        kw = dict(qkv_format="bshd", attn_mask_type=mask)
        pert = [
            (
                _future(x, t, 1, PERTURBATIONS[name](gen, x[:, t + 1 :].shape).half())
                if n in which
                else x
            )
            for n, x in zip("qkv", (q, k, v))
        ]
        base = _grads(recipe, q, k, v, d_out, kw, unguarded=unguarded)
        after = _grads(recipe, *pert, d_out, kw, unguarded=unguarded)
        keep = torch.arange(s) <= t
        assert all(not torch.equal(x, y) for x, y, n in zip(pert, (q, k, v), "qkv") if n in which)
        return _changed(base, after, keep, keep, "bshd")

    @pytest.mark.parametrize("recipe", RECIPES)
    @pytest.mark.parametrize("name", list(PERTURBATIONS))
    def test_future_tokens_change_no_prefix_gradient(recipe, name):
        changed = _prefix_change(recipe, name)
        assert changed == 0, f"{recipe}/{name}: {changed} prefix gradient elements changed"

    @pytest.mark.parametrize("recipe", RECIPES)
    def test_leaky_emulation_is_caught_by_future_tokens(recipe):
        """Negative control: the backward this replaced (scores of the dequantized Q, K, no
        clamp, masks by multiplication) lets the largest finite future values into the prefix
        gradients (exp overflows to inf for the rows after t, inf * 0 = NaN)."""
        assert _prefix_change(recipe, "max-finite", unguarded=True) > 0

    @pytest.mark.parametrize("recipe", RECIPES)
    def test_overflowed_forward_rows_change_no_prefix_gradient(recipe):
        """Rows after t whose forward overflowed (O and LSE NaN or +inf, as BF16 inputs near
        1e37 can make them) and whose dO is 0: the clamp, the NaN guard on P and the dO != 0
        guard in D keep them out of every prefix gradient; the leaky emulation is caught."""
        gen = torch.Generator().manual_seed(6)
        b, s, h, h_kv, d, t = 1, 96, 2, 2, 64, 40
        q, k, v = (_randn(gen, b, s, n, d) for n in (h, h_kv, h_kv))
        d_out = _future(_randn(gen, b, s, h, d), t, 1, torch.zeros(()))
        kw = dict(qkv_format="bshd", attn_mask_type="causal")
        out, lse = _reference_forward(recipe, q, k, v, kw)
        keep = torch.arange(s) <= t
        base = _backward(recipe, q, k, v, out, d_out, lse, kw)
        for bad in (float("nan"), float("inf")):
            out_bad = _future(out, t, 1, torch.tensor(bad))
            lse_bad = _future(lse, t, 1, torch.tensor(bad))
            after = _backward(recipe, q, k, v, out_bad, d_out, lse_bad, kw)
            assert _changed(base, after, keep, keep, "bshd") == 0, bad
        leaky = [
            _backward(recipe, q, k, v, o, d_out, l, kw, unguarded=True)
            for o, l in ((out, lse), (out_bad, lse_bad))
        ]
        assert _changed(*leaky, keep, keep, "bshd") > 0

    GARBAGE = {"nan": float("nan"), "inf": float("inf"), "max": FP16_MAX, "random": None}

    def _with_padding_garbage(x, lens, value, gen, dim=1):
        y = x.clone()
        for b, n in enumerate(lens):
            pad = y.select(1 - dim if dim == 1 else 1, b).narrow(0, n, y.shape[dim] - n)
            if value is None:
                pad.copy_((torch.rand(pad.shape, generator=gen) * 2 - 1) * FP16_MAX)
            else:
                pad.fill_(value)
        return y

    @pytest.mark.parametrize("recipe", RECIPES)
    def test_padding_garbage_changes_no_real_gradient(recipe):
        """bshd padding_causal, lengths [100, 37] of 128: NaN, Inf, 65504 or random values in
        the padded positions of Q, K, V, dO, O (and NaN in their LSE) change no real gradient,
        and the padded positions' gradients are 0. The leaky emulation reads the padding."""
        gen = torch.Generator().manual_seed(7)
        lens = [100, 37]
        q, k, v, d_out = (_randn(gen, 2, 128, n, 64) for n in (2, 1, 1, 2))
        kw = dict(qkv_format="bshd", attn_mask_type="padding_causal")
        kw["cu_seqlens_q"] = kw["cu_seqlens_kv"] = _cu(lens)
        out, lse = _reference_forward(recipe, q, k, v, kw)
        real = torch.cat([torch.arange(128) < n for n in lens])
        base = _backward(recipe, q, k, v, out, d_out, lse, kw)
        for value in GARBAGE.values():
            garbage = [_with_padding_garbage(x, lens, value, gen) for x in (q, k, v, d_out, out)]
            lse_g = torch.where(real[None, :], lse, float("nan"))
            after = _backward(recipe, *garbage[:3], garbage[4], garbage[3], lse_g, kw)
            assert _changed(base, after, real, real, "bshd") == 0, value
            assert all(not g.flatten(0, 1)[~real].any() for g in after), value
        garbage = [_with_padding_garbage(x, lens, float("nan"), gen) for x in (q, k, v)]
        leaky = [
            _backward(recipe, *xs, out, d_out, lse, kw, unguarded=True)
            for xs in ((q, k, v), garbage)
        ]
        assert _changed(*leaky, real, real, "bshd") > 0

    @pytest.mark.parametrize("recipe", RECIPES)
    def test_other_sample_and_other_sequence_change_nothing(recipe):
        """Changing sample 1 of a bshd batch (no_mask) or sequence 1 of a thd pack (to the
        largest finite values) changes no gradient of the other samples / sequences."""
        gen = torch.Generator().manual_seed(8)
        q, k, v, d_out = (_randn(gen, 2, 96, n, 64) for n in (2, 1, 1, 2))
        kw = dict(qkv_format="bshd", attn_mask_type="no_mask")
        base = _grads(recipe, q, k, v, d_out, kw)
        pert = [x.clone() for x in (q, k, v, d_out)]
        for x in pert:
            x[1] = FP16_MAX
        after = _grads(recipe, *pert, kw)
        sample0 = torch.arange(2 * 96) < 96
        assert _changed(base, after, sample0, sample0, "bshd") == 0
        assert not torch.equal(base[2][1], after[2][1])  # sample 1 did change

        lens = [50, 61, 40]
        cu = _cu(lens)
        x = [_randn(gen, int(cu[-1]), n, 64) for n in (2, 1, 1, 2)]
        kw = dict(qkv_format="thd", attn_mask_type="padding_causal")
        kw.update(cu_seqlens_q=cu, cu_seqlens_kv=cu)
        base = _grads(recipe, *x, kw)
        seq1 = (torch.arange(int(cu[-1])) >= 50) & (torch.arange(int(cu[-1])) < 111)
        pert = [torch.where(seq1[:, None, None], FP16_MAX, y).half() for y in x]
        after = _grads(recipe, *pert, kw)
        assert _changed(base, after, ~seq1, ~seq1, "thd") == 0

    @pytest.mark.parametrize("recipe", RECIPES)
    def test_thd_gap_garbage_changes_no_real_gradient(recipe):
        gen = torch.Generator().manual_seed(9)
        grads = {}
        for name, value in GARBAGE.items():
            q, k, v, d_out, out, lse, kw, real = _thd(
                torch.Generator().manual_seed(10), [70, 1, 45], [9, 0, 20], value or 0.0
            )
            if value is None:
                noise = [(torch.rand(x.shape, generator=gen) * 2 - 1) * FP16_MAX for x in (q, k)]
                q, k = (
                    torch.where(real[:, None, None], x, n).half() for x, n in zip((q, k), noise)
                )
            grads[name] = _backward(recipe, q, k, v, out, d_out, lse, kw)
        base = grads.pop("nan")
        for name, after in grads.items():
            assert _changed(base, after, real, real, "thd") == 0, name
        assert all(not g[~real].any() and torch.isfinite(g).all() for g in base)

    @pytest.mark.parametrize("recipe", RECIPES)
    def test_positions_outside_the_window_change_nothing(recipe):
        """Sliding window (40, 0): rows >= 70 never see positions < 30; the loss is over rows
        >= 70; Q, K, V before 30 turn to the largest finite values."""
        gen = torch.Generator().manual_seed(11)
        q, k, v, d_out = (_randn(gen, 1, 128, n, 64) for n in (2, 2, 2, 2))
        d_out[:, :70] = 0
        kw = dict(qkv_format="bshd", attn_mask_type="causal", window_size=(40, 0))
        base = _grads(recipe, q, k, v, d_out, kw)
        pert = [x.clone() for x in (q, k, v)]
        for x in pert:
            x[:, :30] = FP16_MAX
        after = _grads(recipe, *pert, d_out, kw)
        rows = torch.arange(128) >= 70
        assert _changed(base, after, rows, torch.arange(128) >= 30, "bshd") == 0

    @pytest.mark.parametrize("recipe", RECIPES)
    def test_rows_that_see_nothing_get_zero_gradients(recipe):
        """Bottom-right causal with s_q > s_kv (the first rows see no key), and a padding sample
        with no keys at all: zero dq there, finite everywhere."""
        gen = torch.Generator().manual_seed(12)
        q, d_out = (_randn(gen, 1, 100, 2, 64) for _ in range(2))
        k, v = (_randn(gen, 1, 70, 2, 64) for _ in range(2))
        kw = dict(qkv_format="bshd", attn_mask_type="causal_bottom_right")
        dq, dk, dv = _grads(recipe, q, k, v, d_out, kw)
        assert not dq[:, :30].any() and dq[:, 30:].any()
        assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
        q, k, v, d_out = (_randn(gen, 2, 64, 2, 64) for _ in range(4))
        kw = dict(qkv_format="bshd", attn_mask_type="padding")
        kw.update(cu_seqlens_q=_cu([64, 64]), cu_seqlens_kv=_cu([64, 0]))
        dq, dk, dv = _grads(recipe, q, k, v, d_out, kw)
        assert not dq[1].any() and not dk[1].any() and not dv[1].any() and dq[0].any()
        assert all(torch.isfinite(g).all() for g in (dq, dk, dv))

    def test_forward_and_backward_kernels_together():
        """The Triton forward (Q quantized outside, as the interpreter needs) feeding the
        backward: prefix gradients keep their bits under the largest finite future values."""
        gen = torch.Generator().manual_seed(13)
        s, t = 128, 50
        q, k, v = (_randn(gen, 1, s, 2, 64) for _ in range(3))
        d_out = _future(_randn(gen, 1, s, 2, 64), t, 1, torch.zeros(()))
        kw = dict(qkv_format="bshd", attn_mask_type="causal")

        def run(q, k, v):
            q_fp8 = quantize.per_token_cast_to_fp8(q, qkv_format="bshd", backend="torch")
            out, lse = exact_fp8_attention_forward(q, k, v, recipe="current", q_fp8=q_fp8, **kw)
            return out, _backward("current", q, k, v, out, d_out, lse, kw)

        out, base = run(q, k, v)
        out_after, after = run(*(_future(x, t, 1, torch.tensor(FP16_MAX)) for x in (q, k, v)))
        keep = torch.arange(s) <= t
        assert _changed(base, after, keep, keep, "bshd") == 0
        assert not torch.equal(out[:, t + 1 :], out_after[:, t + 1 :])  # the forward saw it

    # ------------------------------------------------------------------ errors

    def test_inputs_are_checked():
        q = torch.zeros(1, 32, 2, 64).half()
        lse = torch.zeros(2, 32)
        with pytest.raises(ValueError, match="d_out"):
            exact_fp8_attention_backward(q, q, q, q, q[:, :16], lse, recipe="current")
        with pytest.raises(ValueError, match="lse"):
            exact_fp8_attention_backward(q, q, q, q, q, lse[:1], recipe="current")
        with pytest.raises(ValueError, match="recipe"):
            exact_fp8_attention_backward(q, q, q, q, q, lse, recipe="fp4")
