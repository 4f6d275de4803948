"""The causality audit through TE's DotProductAttention on the GPU (a small run).

The bug report's repro and one randomized scenario, every path: BF16 and the fork's paths must be
exact; upstream's current scaling must leak as in the report (through its unfused FP8 emulation on
sm90, its fused kernel from sm100); upstream's MXFP8 runs only from compute capability 10.0 and is
otherwise reported as not runnable. The prefix-change sweep must show the same picture.
"""

import pytest
import torch

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.audit import (
    cli as audit,
    plot as audit_plot,
    te_runner as audit_te,
)

if not torch.cuda.is_available():
    pytest.skip("the audit's GPU mode needs a CUDA GPU", allow_module_level=True)
_TE_ERROR = audit_te.te_import_error()
if _TE_ERROR:
    pytest.skip(f"the audit's GPU mode needs TE: {_TE_ERROR}", allow_module_level=True)

SCENARIOS = ["report-current-future", "report-mx-same-block", "random-future-v"]


@pytest.fixture(scope="module")
def rows():
    rows = audit.run_audit(audit_te.TE_PATHS, SCENARIOS, trials=1, mode="te")
    print("\n" + audit.format_table(rows))
    return {(r.path, r.scenario): r for r in rows}


@pytest.mark.parametrize("path", audit.MUST_BE_EXACT)
def test_bf16_and_fork_paths_are_exact_through_te(rows, path):
    for name in SCENARIOS:
        row = rows[(path, name)]
        assert row.exact is True, f"{path} {name}: {row}"


def test_upstream_current_scaling_leaks_as_in_the_report(rows):
    row = rows[("upstream-current", "report-current-future")]
    assert (row.max_abs, row.changed, row.exact) == (2.0**-10, 8, False)
    if torch.cuda.get_device_capability() < (10, 0):
        assert "FP8 emulation" in row.backend


def test_upstream_mxfp8_leaks_or_says_why_it_cannot_run(rows):
    row = rows[("upstream-mxfp8", "report-mx-same-block")]
    if torch.cuda.get_device_capability() < (10, 0):
        assert row.exact is None and "10.0" in row.note
    else:
        assert (row.max_abs, row.changed, row.exact) == (2.0**-20, 8, False)


def test_sweep_through_te():
    paths = ["bf16", "upstream-current", "fork-current", "fork-mxfp8"]
    sweep = audit_plot.distance_sweep(audit_te.te_runner, paths, max_distance=64)
    print("\n" + audit_plot.format_sweep(sweep))
    res = sweep["paths"]
    for path in ("bf16", "fork-current", "fork-mxfp8"):
        assert res[path]["max_abs"] == [0.0] * len(sweep["distances"]), path
    assert all(m > 0 for m in res["upstream-current"]["max_abs"])
