"""The upstream bug report's repro (DESIGN.md section 7), bit for bit, through the reference rules."""

import pytest

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.attention import (
    PATHS,
    reference_attention,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import to_tokens
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.audit.scenarios import (
    build_scenario,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
    prefix_change,
)

# (scenario, path) -> (max_abs, changed, O[7, 0] before, O[7, 0] after); exact float literals.
LEAKS = {
    ("report-mx-same-block", "upstream-mxfp8"): (9.5367431641e-07, 8, 1.1920928955e-07, 0.0),
    ("report-current-future", "upstream-current"): (9.7656250000e-04, 8, 1.2207031250e-04, 0.0),
}
SCENARIOS = ("report-mx-same-block", "report-mx-next-block", "report-current-future")


def _run(path, name):
    sc = build_scenario(name)
    base = reference_attention(path, sc.q, sc.k, sc.v, **sc.kwargs).out
    pert = reference_attention(path, sc.q2, sc.k2, sc.v2, **sc.kwargs).out
    fmt = sc.kwargs["qkv_format"]
    return base, pert, prefix_change(to_tokens(base, fmt), to_tokens(pert, fmt), sc.protected)


@pytest.mark.parametrize("name", SCENARIOS)
@pytest.mark.parametrize("path", PATHS)
def test_report_scenario(path, name):
    base, pert, (max_abs, changed) = _run(path, name)
    if (name, path) in LEAKS:
        want_max, want_changed, before, after = LEAKS[(name, path)]
        assert (f"{max_abs:.10e}", changed) == (f"{want_max:.10e}", want_changed)
        assert f"{float(base[7, 0, 0, 0]):.10e}" == f"{before:.10e}"
        assert float(pert[7, 0, 0, 0]) == after
    else:
        assert (max_abs, changed) == (0.0, 0), f"{path} leaks in {name}"


def test_report_values_are_exact_powers_of_two():
    """The report's figures are 2^-20, 2^-23, 2^-10 and 2^-13: the leak zeroes V[0, 0] exactly."""
    assert 9.5367431641e-07 == pytest.approx(2.0**-20, rel=1e-10)
    base, _, _ = _run("bf16", "report-mx-same-block")
    assert float(base[7, 0, 0, 0]) == 2.0**-23
    base, _, _ = _run("bf16", "report-current-future")
    assert float(base[7, 0, 0, 0]) == 2.0**-13
