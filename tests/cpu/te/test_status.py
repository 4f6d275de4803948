"""te/status.py: the per-process record of mask-exact FP8 attention calls and its log lines."""

import logging

import pytest

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.te import status

LOGGER = logging.getLogger("DotProductAttention")


@pytest.fixture(autouse=True)
def fresh_status(monkeypatch):
    """A fresh record, and the once-per-process log lines not yet logged."""
    monkeypatch.setattr(status, "_announced", False)
    monkeypatch.setattr(status, "_warned", set())
    status.reset()
    yield
    status.reset()


def test_runs_are_counted_and_the_first_is_logged_once_at_info(caplog):
    caplog.set_level(logging.DEBUG, logger="DotProductAttention")
    assert status.status() == status.MaskExactStatus()
    status.record_run("triton", "current", LOGGER)
    status.record_run("triton", "mxfp8", LOGGER)
    s = status.status()
    assert (s.mask_exact_calls, s.last_kernel_backend, s.last_recipe) == (2, "triton", "mxfp8")
    assert s.ran_mask_exact and s.fallback_calls == 0
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1
    assert "Running with mask-exact FP8 attention (recipe current, kernel backend triton)" in (
        infos[0].getMessage()
    )
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert debug == ["Running with mask-exact FP8 attention (recipe mxfp8, kernel backend triton)"]
    status.record_run("triton", "mxfp8", LOGGER)  # no change: nothing logged
    assert len(caplog.records) == 2


def test_missing_dependencies_warn_once_per_reason_other_fallbacks_are_debug(caplog):
    caplog.set_level(logging.DEBUG, logger="DotProductAttention")
    for _ in range(3):
        status.record_fallback(status.TRITON_MISSING, LOGGER)
        status.record_fallback(status.EXTENSION_MISSING, LOGGER)
        status.record_fallback("softcap=30.0", LOGGER)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "Disabling mask-exact FP8 attention for Triton is not installed" in warnings[0]
    assert "pip install triton" in warnings[0]
    assert "transformer_engine_exact_fp8 is not built" in warnings[1]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert debug.count(status.DISABLED % "softcap=30.0") == 3
    assert debug.count(status.DISABLED % status.TRITON_MISSING) == 2  # later calls: debug
    s = status.status()
    assert s.fallbacks == {
        status.TRITON_MISSING: 3,
        status.EXTENSION_MISSING: 3,
        "softcap=30.0": 3,
    }
    assert s.fallback_calls == 9 and not s.ran_mask_exact


def test_reset_zeroes_the_counts_but_logs_once_per_process(caplog):
    caplog.set_level(logging.INFO, logger="DotProductAttention")
    status.record_run("triton", "current", LOGGER)
    status.record_fallback(status.TRITON_MISSING, LOGGER)
    snapshot = status.status()
    status.reset()
    assert status.status() == status.MaskExactStatus()
    assert snapshot.mask_exact_calls == 1 and snapshot.fallbacks == {status.TRITON_MISSING: 1}
    status.record_run("triton", "current", LOGGER)
    status.record_fallback(status.TRITON_MISSING, LOGGER)
    assert len([r for r in caplog.records if r.levelno >= logging.INFO]) == 2


def test_the_snapshot_is_a_copy():
    status.record_fallback("softcap=30.0", LOGGER)
    s = status.status()
    s.fallbacks["softcap=30.0"] = 99
    assert status.status().fallbacks == {"softcap=30.0": 1}
