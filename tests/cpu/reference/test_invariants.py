"""Property tests of every invariant of DESIGN.md section 2 through the reference rules.

The fork's rules (both recipes) and the BF16 control must never change a protected output, bitwise,
over random shapes, positions and perturbations. Upstream's rules are the negative controls: the
same checks must catch them leaking, so the checks are known to be able to fail.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.formats import (
    KV_TILE,
    Q_TILE,
)

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import (
    allowed_positions,
    fp8_tile_map,
    to_tokens,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.attention import (
    QuantConfig,
    reference_attention,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.audit.scenarios import (
    RANDOM_SCENARIOS,
    build_scenario,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
    prefix_change,
)

EXACT_PATHS = ("fork-current", "fork-mxfp8", "bf16")
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _change(path, sc, quant=QuantConfig()):
    kw = sc.kwargs
    base = reference_attention(path, sc.q, sc.k, sc.v, quant=quant, **kw)
    pert = reference_attention(path, sc.q2, sc.k2, sc.v2, quant=quant, **kw)
    fmt = kw["qkv_format"]
    return prefix_change(to_tokens(base.out, fmt), to_tokens(pert.out, fmt), sc.protected), base


@pytest.mark.parametrize("name", sorted(RANDOM_SCENARIOS))
@pytest.mark.parametrize("path", EXACT_PATHS)
@SETTINGS
@given(seed=st.integers(0, 2**31 - 1))
def test_exact_paths_keep_every_invariant(path, name, seed):
    sc = build_scenario(name, torch.Generator().manual_seed(seed))
    (max_abs, changed), base = _change(path, sc)
    assert changed == 0, f"{path} changed {changed} protected outputs (max {max_abs}) in {name}"
    if path != "bf16":  # the check must not pass by never using FP8 V
        assert any(bool(t.any()) for t in base.fp8_tiles), f"{name}: no FP8 tile was used"


@SETTINGS
@given(
    seed=st.integers(0, 2**31 - 1),
    pow2=st.booleans(),
    eps=st.sampled_from([0.0, 1e-12, 1e-2]),
    dtype=st.sampled_from([torch.bfloat16, torch.float16]),
)
def test_fork_current_recipe_knobs_keep_causality(seed, pow2, eps, dtype):
    """use_power_2_scales, amax_epsilon and fp16 inputs do not open a leak."""
    sc = build_scenario("random-future-v", torch.Generator().manual_seed(seed))
    sc.q, sc.k, sc.v, sc.q2, sc.k2, sc.v2 = (
        x.to(dtype) for x in (sc.q, sc.k, sc.v, sc.q2, sc.k2, sc.v2)
    )
    (_, changed), _ = _change("fork-current", sc, QuantConfig(pow2, eps))
    assert changed == 0


# Negative controls: where upstream's rules break an invariant, the same check catches it. Upstream
# MXFP8 quantizes Q, K per token and V per sample, so it keeps Q/K causality and batch isolation.
UPSTREAM_LEAKS = {
    "upstream-current": sorted(RANDOM_SCENARIOS),
    "upstream-mxfp8": [
        "random-future-v",
        "random-future-v-bottom-right",
        "random-padding-garbage",
        "random-window-outside",
    ],
}


@pytest.mark.parametrize(
    "path,name", [(p, n) for p, names in UPSTREAM_LEAKS.items() for n in names]
)
def test_upstream_rules_are_caught_leaking(path, name):
    """Over a few seeds the upstream rule must change some protected output."""
    leaks = 0
    for seed in range(4):
        (_, changed), _ = _change(path, build_scenario(name, torch.Generator().manual_seed(seed)))
        leaks += changed > 0
    assert leaks > 0, f"{path} was expected to leak in {name}"


@SETTINGS
@given(
    len_q=st.integers(1, 400),
    len_kv=st.integers(1, 400),
    mask=st.sampled_from(["causal", "causal_bottom_right", "no_mask", "padding_causal"]),
    left=st.integers(-1, 300),
)
def test_fp8_tiles_are_fully_visible(len_q, len_kv, mask, left):
    """An FP8 tile pair is complete and visible to every real row of the query tile."""
    allowed = allowed_positions(mask, (left, -1), len_q, len_kv)
    tiles = fp8_tile_map(allowed, len_q)
    for qt, kt in tiles.nonzero().tolist():
        rows = slice(qt * Q_TILE, min(qt * Q_TILE + Q_TILE, len_q))
        block = allowed[rows, kt * KV_TILE : (kt + 1) * KV_TILE]
        assert block.shape[1] == KV_TILE and bool(block.all())
