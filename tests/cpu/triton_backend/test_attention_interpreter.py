"""The mask-exact FP8 attention kernel under Triton's CPU interpreter (TRITON_INTERPRET=1).

Triton chooses the interpreter when a kernel is defined, so the cases run in a child pytest
process with TRITON_INTERPRET=1 (another module of the same session may hold the compiled
kernel). What the interpreter can check (docs/attention_kernel.md): FP8 (e4m3), FP16 and FP32
tl.dot are exact there, but fp32 -> float8e4nv casts are wrong, the E4M3 NaN code reads as 480
(so a NaN in Q or K cannot be followed here) and BF16 dots are garbage. So the
cases use FP16 inputs and a Q quantized outside the kernel, and check:

  * the in-kernel scale rules (integer and fp32 paths) against formats.py, bitwise;
  * the tile decisions (FP8 / boundary / skipped) against masks.fp8_tile_map, exhaustively,
    and the boundary sub-tiles walked against the positions the rows see;
  * the LSE against the reference (it does not involve the P cast): masks, layouts, GQA;
  * outputs against the reference where the P cast is exact (uniform attention: P = P_SCALE);
  * bitwise invariance of the outputs under perturbations the mask hides (the scenarios), with
    the leaky fp8_v_everywhere mode as the negative control that must be caught.

Value accuracy with the FP8 P cast, and the in-kernel Q cast, are checked on the GPU
(tests/pytorch/attention/test_exact_fp8_attention.py).
"""

import os

import pytest

from triton_interpreter_support import index_scalars_with_numpy_2_4, run_under_interpreter

if os.environ.get("TRITON_INTERPRET") != "1":

    def test_attention_kernel_under_triton_interpreter():
        run_under_interpreter(__file__)

else:
    import torch
    import triton
    import triton.language as tl

    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import (
        formats,
        quantize,
    )
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton import (
        masking as kernel_masking,
        scaling as kernel_scaling,
    )
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton.attention import (
        exact_fp8_attention_forward,
    )
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton.attention_kernel import (
        BOUNDARY_N,
    )
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.formats import (
        KV_TILE,
        Q_TILE,
    )
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import (
        MASK_TYPES,
        allowed_positions,
        fp8_tile_map,
        to_tokens,
    )
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.attention import (
        QuantConfig,
        reference_attention,
    )
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.audit.scenarios import (
        REPORT_SCENARIOS,
        RANDOM_SCENARIOS,
        build_scenario,
    )
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
        prefix_change,
        rel_frobenius_error,
    )

    index_scalars_with_numpy_2_4()

    RECIPES = ("current", "mxfp8")

    # ---------------------------------------------------------------- scale rules, bitwise

    @triton.jit
    def _scale_rules_kernel(
        AMAX, CODES, SCALE, SCALE_POW2, E8M0, TO_FP32, RECIPROCAL, eps, N: tl.constexpr
    ):
        offs = tl.arange(0, N)
        amax = tl.load(AMAX + offs)
        code = tl.load(CODES + offs).to(tl.int32)
        tl.store(SCALE + offs, kernel_scaling.scale_from_amax(amax, eps, 0))
        tl.store(SCALE_POW2 + offs, kernel_scaling.scale_from_amax(amax, eps, 1))
        tl.store(E8M0 + offs, kernel_scaling.e8m0_from_amax(amax))
        tl.store(TO_FP32 + offs, kernel_scaling.e8m0_to_fp32(code))
        tl.store(RECIPROCAL + offs, kernel_scaling.e8m0_reciprocal(code))

    def _amax_samples(n):
        """Edge values of the rules, then fp32 bit patterns spread over the whole range."""
        edges = [0.0, 2.0**-149, 2.0**-127, 2.0**-126, 448 * 2.0**-127, 448 * 2.0**-126, 1.0]
        edges += [448.0, 449.0, 2.0**100, formats.FP32_MAX, float("inf"), float("nan")]
        rest = torch.randint(
            0, 0x7F800000, (n - len(edges),), generator=torch.Generator().manual_seed(0)
        )
        return torch.cat([torch.tensor(edges, dtype=torch.float32), rest.int().view(torch.float32)])

    def _bits(x):
        return x.view(torch.int32) if x.dtype == torch.float32 else x

    @pytest.mark.parametrize("eps", [0.0, 1e-12, 1e-2])
    def test_scale_rules_match_formats_bitwise(eps):
        n = 512
        amax = _amax_samples(n)
        codes = torch.arange(n, dtype=torch.int32) % 256
        outs = [torch.empty(n) for _ in range(2)] + [torch.empty(n, dtype=torch.int32)]
        outs += [torch.empty(n) for _ in range(2)]
        _scale_rules_kernel[(1,)](amax, codes, *outs, eps, N=n)
        want = [
            formats.compute_scale_from_amax(amax, amax_epsilon=eps),
            formats.compute_scale_from_amax(amax, use_power_2_scales=True, amax_epsilon=eps),
            formats.float_to_e8m0(amax).int(),
            formats.e8m0_to_float(codes),
            formats.e8m0_reciprocal(codes),
        ]
        for got, ref in zip(outs, want):
            nan = torch.isnan(ref)
            assert torch.equal(torch.isnan(got), nan)
            assert torch.equal(_bits(got)[~nan], _bits(ref)[~nan])

    # ------------------------------------------------------------------ tile decisions

    @triton.jit
    def _tile_ranges_kernel(GEOM, OUT, N: tl.constexpr, BLOCK_M: tl.constexpr):
        offs = tl.arange(0, N)
        q_lo, len_q, len_kv, diag, left, right = (tl.load(GEOM + offs * 6 + i) for i in range(6))
        ranges = kernel_masking.kv_tile_ranges(
            q_lo, len_q, len_kv, diag, left, right, BLOCK_M, Q_TILE, KV_TILE
        )
        for i in tl.static_range(4):
            tl.store(OUT + offs * 4 + i, ranges[i])

    def _geometries(gen):
        """(mask, window, len_q, len_kv, span_q, span_kv) over all masks, windows and lengths."""
        out = []
        for mask in MASK_TYPES:
            for _ in range(24):
                len_q, len_kv = (int(x) for x in torch.randint(0, 700, (2,), generator=gen))
                if mask in ("causal", "padding_causal", "no_mask") and not len(out) % 3:
                    len_kv = len_q
                spans = (len_q + int(torch.randint(0, 90, (1,), generator=gen)), len_kv + 5)
                sides = torch.randint(-1, 400, (2,), generator=gen).tolist()
                window = None if len(out) % 4 == 0 else tuple(sides)
                out.append((mask, window, len_q, len_kv) + spans)
        return out

    def _kernel_sides(mask, window, len_q, len_kv):
        """(diag, left, right) as the kernel takes them."""
        left, right = window if window is not None else (-1, -1)
        right = 0 if "causal" in mask else right
        diag = 0 if mask in ("causal", "padding_causal") else len_kv - len_q
        return [diag] + [kernel_masking.UNBOUNDED if x < 0 else x for x in (left, right)]

    @pytest.mark.parametrize("block_m", [64, 128])
    def test_tile_ranges_match_fp8_tile_map(block_m):
        """Per block of query rows: FP8 tiles = fp8_tile_map's row of the enclosing 128-row
        tile (whatever block_m), visited tiles = those some real row of the block sees."""
        rows = []
        geometries = _geometries(torch.Generator().manual_seed(1))
        for mask, window, len_q, len_kv, span_q, span_kv in geometries:
            allowed = allowed_positions(mask, window, len_q, len_kv, span_q, span_kv)
            tiles = fp8_tile_map(allowed, len_q)
            for q_lo in range(0, span_q, block_m):
                real = allowed[q_lo : min(q_lo + block_m, len_q)]
                n_kt = tiles.shape[1]
                seen = [
                    bool(real[:, kt * KV_TILE : (kt + 1) * KV_TILE].any()) for kt in range(n_kt)
                ]
                fp8 = tiles[q_lo // Q_TILE].tolist() if len(real) else [False] * n_kt
                geo = (q_lo, len_q, len_kv, *_kernel_sides(mask, window, len_q, len_kv))
                rows.append((geo, fp8, seen))
        n = triton.next_power_of_2(len(rows))
        geom = torch.zeros(n, 6, dtype=torch.int32)
        geom[: len(rows)] = torch.tensor([r[0] for r in rows], dtype=torch.int32)
        out = torch.empty(n, 4, dtype=torch.int32)
        _tile_ranges_kernel[(1,)](geom, out, N=n, BLOCK_M=block_m)
        for (geo, fp8, seen), (kv_lo, fp8_lo, fp8_hi, kv_hi) in zip(rows, out.tolist()):
            assert [fp8_lo <= kt < fp8_hi for kt in range(len(fp8))] == fp8, geo
            assert [kv_lo <= kt < kv_hi for kt in range(len(seen))] == seen, geo

    @triton.jit
    def _subtile_ranges_kernel(
        GEOM, OUT, N: tl.constexpr, BLOCK_M: tl.constexpr, SUB_TILE: tl.constexpr
    ):
        offs = tl.arange(0, N)
        q_lo, len_q, len_kv, diag, left, right = (tl.load(GEOM + offs * 6 + i) for i in range(6))
        tiles = kernel_masking.kv_tile_ranges(
            q_lo, len_q, len_kv, diag, left, right, BLOCK_M, Q_TILE, KV_TILE
        )
        subtiles = kernel_masking.boundary_subtile_ranges(
            q_lo, len_q, len_kv, diag, left, right, *tiles, BLOCK_M, KV_TILE, SUB_TILE
        )
        for i in tl.static_range(4):
            tl.store(OUT + offs * 8 + i, tiles[i])
            tl.store(OUT + offs * 8 + 4 + i, subtiles[i])

    @pytest.mark.parametrize("block_m", [64, 128])
    def test_boundary_subtiles_are_the_seen_part_of_the_boundary_tiles(block_m):
        """The boundary sub-tiles a block walks (right range, then left) are exactly the
        BOUNDARY_N-position sub-tiles of its boundary tiles that some real row of it sees."""
        sub = BOUNDARY_N
        per_tile = KV_TILE // sub
        rows, want = [], []
        for mask, window, len_q, len_kv, span_q, span_kv in _geometries(
            torch.Generator().manual_seed(2)
        ):
            allowed = allowed_positions(mask, window, len_q, len_kv, span_q, span_kv)
            for q_lo in range(0, span_q, block_m):
                real = allowed[q_lo : min(q_lo + block_m, len_q)]
                n_sub = triton.cdiv(allowed.shape[1], sub)
                seen = [bool(real[:, j * sub : (j + 1) * sub].any()) for j in range(n_sub)]
                rows.append((q_lo, len_q, len_kv, *_kernel_sides(mask, window, len_q, len_kv)))
                want.append(seen)
        n = triton.next_power_of_2(len(rows))
        geom = torch.zeros(n, 6, dtype=torch.int32)
        geom[: len(rows)] = torch.tensor(rows, dtype=torch.int32)
        out = torch.empty(n, 8, dtype=torch.int32)
        _subtile_ranges_kernel[(1,)](geom, out, N=n, BLOCK_M=block_m, SUB_TILE=sub)
        for geo, seen, got in zip(rows, want, out.tolist()):
            kv_lo, fp8_lo, fp8_hi, kv_hi, right_lo, right_hi, left_lo, left_hi = got
            assert kv_lo * per_tile <= left_lo <= left_hi <= fp8_lo * per_tile, geo
            assert fp8_hi * per_tile <= right_lo <= right_hi <= kv_hi * per_tile, geo
            walked = set(range(right_lo, right_hi)) | set(range(left_lo, left_hi))
            fp8 = set(range(fp8_lo * per_tile, fp8_hi * per_tile))
            assert walked == {j for j, s in enumerate(seen) if s} - fp8, geo

    @triton.jit
    def _visible_kernel(OUT, len_kv, diag, left, right, M: tl.constexpr, N: tl.constexpr):
        rows = tl.arange(0, M)
        cols = tl.arange(0, N)
        ok = kernel_masking.visible(rows, cols, len_kv, diag, left, right)
        tl.store(OUT + rows[:, None] * N + cols[None, :], ok.to(tl.int8))

    @pytest.mark.parametrize("mask", MASK_TYPES)
    @pytest.mark.parametrize("window", [None, (7, 3), (0, 0), (40, -1)])
    def test_element_mask_matches_allowed_positions(mask, window):
        len_q, len_kv = 50, 60
        allowed = allowed_positions(mask, window, len_q, len_kv, 64, 64)
        out = torch.empty(64, 64, dtype=torch.int8)
        _visible_kernel[(1,)](out, len_kv, *_kernel_sides(mask, window, len_q, len_kv), M=64, N=64)
        assert torch.equal(out[:len_q].bool(), allowed[:len_q])

    # ------------------------------------------------------------------ attention values

    def _quantize_q(q, fmt, recipe):
        """Q quantized outside the kernel by the reference rules (the interpreter's FP8 cast is
        wrong), in the head-major layout the kernel's q_fp8 takes."""
        if recipe == "current":
            return quantize.per_token_cast_to_fp8(q, qkv_format=fmt, backend="torch")
        return quantize.per_block_cast_to_mxfp8_rowwise(q, qkv_format=fmt, backend="torch")

    def _kernel_kwargs(kwargs):
        """Reference kwargs -> kernel kwargs (dense padding lengths travel as cu_seqlens)."""
        kw = dict(kwargs)
        for side in ("q", "kv"):
            lens = kw.pop(f"seqlens_{side}", None)
            if lens is not None:
                kw[f"cu_seqlens_{side}"] = torch.tensor([0] + list(lens)).cumsum(0).int()
        return kw

    def _run(q, k, v, recipe, kwargs, **extra):
        fmt = kwargs.get("qkv_format", "bshd")
        q_fp8 = _quantize_q(q, fmt, recipe)
        return exact_fp8_attention_forward(
            q, k, v, recipe=recipe, q_fp8=q_fp8, **_kernel_kwargs(kwargs), **extra
        )

    def _randn(gen, *shape):
        return torch.randn(*shape, generator=gen).half()

    CASES = [
        dict(qkv_format="bshd", attn_mask_type="causal"),
        dict(qkv_format="sbhd", attn_mask_type="causal_bottom_right"),
        dict(qkv_format="bshd", attn_mask_type="no_mask", window_size=(130, 130)),
        dict(qkv_format="bshd", attn_mask_type="causal", window_size=(200, 0)),
        dict(
            qkv_format="bshd",
            attn_mask_type="padding_causal",
            seqlens_q=[200, 77],
            seqlens_kv=[200, 77],
        ),
        dict(qkv_format="bshd", attn_mask_type="padding", seqlens_q=[150, 3], seqlens_kv=[190, 64]),
        dict(
            qkv_format="bshd",
            attn_mask_type="padding_causal_bottom_right",
            seqlens_q=[60, 200],
            seqlens_kv=[190, 130],
        ),
    ]

    def _case_inputs(case, gen, s_q=None, s_kv=None, h=4, h_kv=2, d=64):
        """Random fp16 q, k, v for `case`. Windowed cases get 300 tokens: a window that hides
        something and still leaves a KV tile that a whole query tile sees needs more than 256."""
        s_default = 300 if case.get("window_size") else 200
        s_q, s_kv = s_q or s_default, s_kv or s_default
        if case["qkv_format"] == "thd":
            t = int(case["cu_seqlens_q"][-1])
            return _randn(gen, t, h, d), _randn(gen, t, h_kv, d), _randn(gen, t, h_kv, d)
        shape_q = (2, s_q, h, d) if case["qkv_format"] == "bshd" else (s_q, 2, h, d)
        shape_kv = (2, s_kv, h_kv, d) if case["qkv_format"] == "bshd" else (s_kv, 2, h_kv, d)
        return _randn(gen, *shape_q), _randn(gen, *shape_kv), _randn(gen, *shape_kv)

    THD = dict(
        qkv_format="thd",
        attn_mask_type="padding_causal",
        cu_seqlens_q=torch.tensor([0, 130, 131, 300], dtype=torch.int32),
    )
    THD["cu_seqlens_kv"] = THD["cu_seqlens_q"]
    OVER_CASES = pytest.mark.parametrize(
        "case",
        CASES + [THD],
        ids=lambda c: f"{c['qkv_format']}-{c['attn_mask_type']}-{c.get('window_size')}",
    )

    @pytest.mark.parametrize("recipe", RECIPES)
    @OVER_CASES
    def test_lse_matches_reference(recipe, case):
        """The LSE depends on the FP8 Q.K^T, the scales and the masks, not on the P cast: it must
        match the fp64 reference to fp32 rounding (scores are O(1), so 1e-4 absolute is ~100 ulp).
        """
        gen = torch.Generator().manual_seed(2)
        s_kv = 150 if case["attn_mask_type"] == "causal_bottom_right" else 200
        q, k, v = _case_inputs(case, gen, s_kv=s_kv)
        _, lse = _run(q, k, v, recipe, case)
        ref = reference_attention("fork-" + recipe, q, k, v, **case)
        finite = torch.isfinite(ref.lse)
        assert torch.equal(torch.isfinite(lse), finite)
        torch.testing.assert_close(lse[finite].double(), ref.lse[finite], rtol=0, atol=1e-4)

    @pytest.mark.parametrize("recipe", RECIPES)
    @OVER_CASES
    def test_uniform_attention_matches_reference(recipe, case):
        """q = 0: every visible key gets P = P_SCALE, which even the interpreter's cast keeps, so
        the outputs (FP8 V with its chunk scales on FP8 tiles, unquantized V elsewhere) must
        match the reference to fp16 rounding of the fp32 result (one ulp)."""
        gen = torch.Generator().manual_seed(3)
        q, k, v = _case_inputs(case, gen)
        q = torch.zeros_like(q)
        out, _ = _run(q, k, v, recipe, case)
        ref = reference_attention("fork-" + recipe, q, k, v, **case)
        assert any(bool(t.any()) for t in ref.fp8_tiles), "no FP8 tile: the case checks nothing"
        torch.testing.assert_close(out, ref.out, rtol=2.0**-10, atol=2.0**-14)

    @pytest.mark.parametrize("pow2", [False, True])
    def test_v_scale_fold_across_chunk_magnitudes(pow2):
        """Note [V scale in the rescale]: V chunks 2^22 apart in magnitude (each 128-token chunk
        times 2^-12, 2^10, 2^-6, 2^4) under uniform attention (q = 0: P = P_SCALE exactly), so
        every FP8 tile rescales the accumulator by a ratio far from 1. Each 128-row block of the
        output matches the reference to fp16 rounding, relative to the block's own magnitude."""
        gen = torch.Generator().manual_seed(8)
        exponents = torch.tensor([-12.0, 10.0, -6.0, 4.0])
        v = (
            torch.randn(1, 512, 1, 64, generator=gen)
            * (2.0**exponents).repeat_interleave(128)[None, :, None, None]
        )
        k = _randn(gen, 1, 512, 1, 64)
        q = torch.zeros(1, 512, 2, 64).half()
        case = dict(qkv_format="bshd", attn_mask_type="causal")
        out, _ = _run(q, k, v.half(), "current", case, use_power_2_scales=pow2)
        quant = QuantConfig(use_power_2_scales=pow2)
        ref = reference_attention("fork-current", q, k, v.half(), quant=quant, **case)
        assert ref.fp8_tiles[0].sum() == 6  # tiles (1, 0), (2, 0..1), (3, 0..2)
        for rows in range(0, 512, 128):
            block = slice(rows, rows + 128)
            err = rel_frobenius_error(out[:, block].double(), ref.out[:, block].double())
            assert err < 2.0**-10, f"rows {rows}..: relative error {err:.2e}"

    @pytest.mark.parametrize("recipe", RECIPES)
    def test_no_keys_give_zero_rows(recipe):
        """No key at all (bshd s_kv = 0, thd kv lengths 0): every row is 0 with LSE -inf, and the
        TMA descriptors of the empty K8 / V8^T are built over a stand-in tile nothing reads."""
        gen = torch.Generator().manual_seed(6)
        cu_q = torch.tensor([0, 5, 9], dtype=torch.int32)
        cases = [
            (_randn(gen, 1, 5, 2, 64), torch.zeros(1, 0, 1, 64).half(), dict(qkv_format="bshd")),
            (
                _randn(gen, 9, 2, 64),
                torch.zeros(0, 1, 64).half(),
                dict(qkv_format="thd", cu_seqlens_q=cu_q, cu_seqlens_kv=torch.zeros_like(cu_q)),
            ),
        ]
        for q, k, kw in cases:
            kw["attn_mask_type"] = "no_mask" if kw["qkv_format"] == "bshd" else "padding"
            out, lse = _run(q, k, k.clone(), recipe, kw)
            assert out.shape == q.shape and not out.any()
            assert bool((lse == float("-inf")).all())

    def test_gqa_and_mqa_pick_the_right_kv_head():
        gen = torch.Generator().manual_seed(4)
        case = dict(qkv_format="bshd", attn_mask_type="causal")
        for h_kv in (1, 2):
            q, k, v = _case_inputs(case, gen, h=4, h_kv=h_kv)
            _, lse = _run(q, k, v, "current", case)
            ref = reference_attention("fork-current", q, k, v, **case)
            torch.testing.assert_close(lse.double(), ref.lse, rtol=0, atol=1e-4)

    @pytest.mark.parametrize("pads", [[7, 64, 0], [7, 300, 0]])
    def test_padded_thd_matches_unpadded_bitwise(pads):
        """Garbage between sequences (cu_seqlens_padded) changes no real output or LSE. With
        pads [7, 300, 0] the second sequence's allocation (301 rows) outgrows the grid's
        max_seqlen_q = 169 rows: the last query block writes the rest as padding."""
        gen = torch.Generator().manual_seed(5)
        lens = [130, 1, 169]
        cu = torch.tensor([0] + lens).cumsum(0).int()
        cu_pad = torch.tensor([0] + [a + b for a, b in zip(lens, pads)]).cumsum(0).int()
        q, k, v = (_randn(gen, int(cu[-1]), 2, 64) for _ in range(3))
        real = torch.cat([torch.arange(int(a), int(a) + n) for a, n in zip(cu_pad[:-1], lens)])
        padded = [torch.full((int(cu_pad[-1]), 2, 64), 3e4).half() for _ in range(3)]
        for p, x in zip(padded, (q, k, v)):
            p[real] = x
        for recipe in RECIPES:
            kw = dict(
                qkv_format="thd", attn_mask_type="padding_causal", cu_seqlens_q=cu, cu_seqlens_kv=cu
            )
            out, lse = _run(q, k, v, recipe, kw)
            kw_pad = dict(kw, cu_seqlens_q_padded=cu_pad, cu_seqlens_kv_padded=cu_pad)
            out_p, lse_p = _run(*padded, recipe, kw_pad)
            assert torch.equal(out_p[real], out) and torch.equal(lse_p[:, real], lse)
            out_g, lse_g = _run(*padded, recipe, dict(kw_pad, max_seqlen_q=int(cu_pad[-1])))
            assert torch.equal(out_g, out_p) and torch.equal(lse_g, lse_p)  # a larger grid
            pad_rows = torch.ones(int(cu_pad[-1]), dtype=torch.bool)
            pad_rows[real] = False
            assert not out_p[pad_rows].any() and torch.isinf(lse_p[:, pad_rows]).all()

    # ------------------------------------------------------------------ invariance, bitwise

    def _diagonal_outlier():
        """report-current-future with its outlier moved into the diagonal tile (V[16, 0] = 1024):
        a current-scaling V chunk holding it would underflow V[0, 0] = 2^-10 for rows 0..7."""
        sc = build_scenario("report-current-future")
        sc.v2 = sc.v.clone()
        sc.v2[16, 0, 0, 0] = 1024.0
        return sc

    def _change(sc, recipe, leaky=False):
        fmt = sc.kwargs["qkv_format"]
        base, pert = (
            _run(*(x.half() for x in xs), recipe, sc.kwargs, fp8_v_everywhere=leaky)[0]
            for xs in ((sc.q, sc.k, sc.v), (sc.q2, sc.k2, sc.v2))
        )
        return prefix_change(to_tokens(base, fmt), to_tokens(pert, fmt), sc.protected)

    @pytest.mark.parametrize("recipe", RECIPES)
    @pytest.mark.parametrize("name", list(REPORT_SCENARIOS) + list(RANDOM_SCENARIOS))
    def test_hidden_tokens_change_nothing(recipe, name):
        sc = build_scenario(name, torch.Generator().manual_seed(11))
        max_abs, changed = _change(sc, recipe)
        assert changed == 0, f"{name}/{recipe}: {changed} protected outputs changed (max {max_abs})"

    @pytest.mark.parametrize("recipe", RECIPES)
    def test_diagonal_tile_outlier_changes_nothing(recipe):
        max_abs, changed = _change(_diagonal_outlier(), recipe)
        assert changed == 0, f"{recipe}: {changed} protected outputs changed (max {max_abs})"

    @pytest.mark.parametrize(
        "scenario,recipe",
        [
            (lambda: build_scenario("report-mx-same-block"), "mxfp8"),
            (_diagonal_outlier, "current"),
        ],
        ids=["report-mx-same-block", "diagonal-tile-outlier"],
    )
    def test_leaky_mode_is_caught(scenario, recipe):
        """Negative control: FP8 V on the diagonal tile lets the future V move the chunk scale."""
        _, changed = _change(scenario(), recipe, leaky=True)
        assert changed > 0, "the leaky fp8_v_everywhere mode was not caught"

    # ------------------------------------------------------------------ errors

    @pytest.mark.parametrize(
        "change,match",
        [
            (dict(recipe="fp4"), "recipe"),
            (dict(qkv_format="bhsd"), "qkv_format"),
            (dict(attn_mask_type="arbitrary"), "attn_mask_type"),
            (dict(d=96), "head dims"),
            (dict(dtype=torch.float32), "bfloat16 or all float16"),
            (dict(recipe="mxfp8", use_power_2_scales=True), "current scaling only"),
            (dict(qkv_format="thd"), "cu_seqlens"),
        ],
    )
    def test_unsupported_inputs_raise(change, match):
        change = dict(change)
        d, dtype = change.pop("d", 64), change.pop("dtype", torch.float16)
        shape = (64, 2, d) if change.get("qkv_format") == "thd" else (1, 64, 2, d)
        q = torch.zeros(shape, dtype=dtype)
        kwargs = dict(dict(recipe="current"), **change)
        with pytest.raises(ValueError, match=match):
            exact_fp8_attention_forward(q, q, q, **kwargs)
