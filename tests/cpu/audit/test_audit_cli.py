"""The causality audit's CPU mode: table, JSON rows, exit status; and the GPU mode's logic that
needs neither TE nor a GPU (path plans, DotProductAttention arguments, rows of paths that cannot
run), with a stand-in for the TE runner."""

import json

import pytest
import torch

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.audit import (
    cli as audit,
    te_runner as audit_te,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.audit.scenarios import (
    build_scenario,
)


def test_audit_cpu_mode_json_and_exit_status(tmp_path, capsys):
    out = tmp_path / "audit.json"
    rc = audit.main(["--device", "cpu", "--trials", "1", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert rc == 0
    assert {"path", "scenario", "max_abs", "changed", "exact"} <= set(rows[0])
    by_key = {(r["path"], r["scenario"]): r for r in rows}
    assert len(by_key) == 5 * 11
    mx = by_key[("upstream-mxfp8", "report-mx-same-block")]
    assert (mx["max_abs"], mx["changed"], mx["exact"]) == (2.0**-20, 8, False)
    cur = by_key[("upstream-current", "report-current-future")]
    assert (cur["max_abs"], cur["changed"], cur["exact"]) == (2.0**-10, 8, False)
    assert by_key[("upstream-mxfp8", "report-mx-next-block")]["exact"]
    assert all(r["exact"] for r in rows if r["path"] in ("bf16", "fork-current", "fork-mxfp8"))
    assert "report-mx-same-block" in capsys.readouterr().out


def test_audit_fails_when_a_fork_path_leaks(monkeypatch):
    """Route fork-current through upstream's rule: the audit must exit non-zero."""
    _route_fork_current_through_upstream(monkeypatch)
    rc = audit.main(
        ["--device", "cpu", "--paths", "fork-current", "--scenarios", "report-current-future"]
    )
    assert rc == 1


def _route_fork_current_through_upstream(monkeypatch):
    real = audit._reference_runner
    monkeypatch.setattr(
        audit,
        "_reference_runner",
        lambda path: real("upstream-current" if path == "fork-current" else path),
    )


def test_a_randomized_row_runs_at_least_one_draw(monkeypatch, capsys):
    """With a leaking rule in a fork path, a randomized scenario fails; --trials 0 is refused."""
    _route_fork_current_through_upstream(monkeypatch)
    argv = ["--device", "cpu", "--paths", "fork-current", "--scenarios", "random-future-v"]
    assert audit.main(argv + ["--trials", "1"]) == 1
    for trials in ("0", "-1"):
        with pytest.raises(SystemExit) as exit_info:
            audit.main(argv + ["--trials", trials])
        assert exit_info.value.code == 2
    with pytest.raises(ValueError, match="trials must be >= 1"):
        audit.run_audit(["fork-current"], ["random-future-v"], trials=0)


@pytest.fixture
def audit_must_not_run(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the audit ran although an argument was bad")

    monkeypatch.setattr(audit, "run_audit", refuse)
    monkeypatch.setattr(audit.plot, "distance_sweep", refuse)


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["--trials", "0"], "argument --trials: must be >= 1, got 0"),
        (["--trials", "three"], "argument --trials: expected a whole number"),
        (["--seed", "-1"], "argument --seed: must be >= 0"),
        (["--max-distance", "100"], "argument --max-distance: must be a power of two"),
        (["--max-distance", "0"], "argument --max-distance: must be a power of two"),
        (["--max-distance", "8192"], "from 1 to 4096"),
        (["--json", "{tmp}/missing/audit.json"], "--json {tmp}/missing/audit.json: the folder"),
        (["--json", "{tmp}"], "--json {tmp}: {tmp} is a directory"),
        (["--plot-data", "{tmp}/no/sweep.json"], "does not exist"),
        (["--plot", "{tmp}"], "is a directory"),
        (["--json", "{tmp}/a.json", "--plot-data", "{tmp}/a.json"], "the output files must differ"),
        (["--paths", "fork"], "argument --paths: invalid choice: 'fork'"),
    ],
)
def test_argument_errors_exit_2_with_one_line_before_the_audit_runs(
    argv, fragment, tmp_path, capsys, audit_must_not_run
):
    argv = [a.format(tmp=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        audit.main(["--device", "cpu"] + argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.count("\n") == 1 and err.startswith("te-fp8-causality-audit: error: ")
    assert fragment.format(tmp=tmp_path) in err


def test_plot_without_matplotlib_says_how_before_the_audit_runs(
    monkeypatch, tmp_path, capsys, audit_must_not_run
):
    monkeypatch.setattr(audit.plot, "matplotlib_missing", lambda: "No module named 'matplotlib'")
    with pytest.raises(SystemExit) as exit_info:
        audit.main(["--device", "cpu", "--plot", str(tmp_path / "a.png")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "pip install matplotlib" in err and "--plot-data" in err


def test_every_option_has_help_text():
    parser = audit._parser()
    options = [a for a in parser._actions if a.option_strings]
    assert {"--device", "--paths", "--scenarios", "--seed", "--plot-data"} <= {
        o for a in options for o in a.option_strings
    }
    assert all(a.help and len(a.help) > 10 for a in options)


def test_output_path_error():
    assert audit.output_path_error("audit.json") is None  # the working directory
    assert "is a directory" in audit.output_path_error(".")


# The GPU mode's logic, without TE or a GPU: path plans, argument conversion, rows and exit status.


def test_te_path_plans_on_sm90_and_sm100():
    plan = audit_te.plan_te_path
    up_mx = plan("upstream-mxfp8", (9, 0), True)
    assert up_mx.not_runnable and "10.0" in up_mx.not_runnable and "sm90" in up_mx.not_runnable
    assert not plan("upstream-mxfp8", (10, 0), True).not_runnable
    up_cur = plan("upstream-current", (9, 0), True)
    assert (up_cur.recipe, up_cur.mask_exact, up_cur.emulate_fp8) == (
        "Float8CurrentScaling",
        False,
        True,
    )
    fork = plan("fork-mxfp8", (9, 0), True)
    assert (fork.recipe, fork.mask_exact, fork.emulate_fp8, fork.not_runnable) == (
        "MXFP8BlockScaling",
        True,
        False,
        "",
    )
    delayed = plan("upstream-delayed", (9, 0), True)
    assert (delayed.recipe, delayed.mask_exact) == ("DelayedScaling", None)
    assert plan("bf16", (9, 0), True).recipe is None


def test_te_path_plans_without_the_fork_field():
    """Against unpatched TE the field is never passed, and the fork paths cannot run."""
    assert audit_te.plan_te_path("upstream-current", (9, 0), False).mask_exact is None
    fork = audit_te.plan_te_path("fork-current", (9, 0), False)
    assert "not the fork" in fork.not_runnable
    with pytest.raises(ValueError):
        audit_te.plan_te_path("fork-delayed", (9, 0), True)


def _dpa_args(name):
    sc = build_scenario(name, torch.Generator().manual_seed(0))
    return sc, *audit_te.dpa_arguments(sc.kwargs, sc.q, sc.k, sc.v)


def test_dpa_arguments_of_the_report_and_gqa_scenarios():
    sc, init, forward = _dpa_args("report-current-future")
    assert init["qkv_format"] == "sbhd" and init["attn_mask_type"] == "causal"
    assert (init["num_attention_heads"], init["num_gqa_groups"], init["kv_channels"]) == (
        1,
        1,
        (128, 128),
    )
    assert init["attention_dropout"] == 0.0 and forward == {}
    sc, init, forward = _dpa_args("random-future-v-bottom-right")
    assert init["attn_mask_type"] == "causal_bottom_right"
    assert (init["num_attention_heads"], init["num_gqa_groups"]) == (2, 1)


def test_dpa_arguments_of_thd_padding_and_window():
    sc, init, forward = _dpa_args("random-thd-other-sequence")
    cu = sc.kwargs["cu_seqlens_q"]
    assert init["qkv_format"] == "thd" and init["attn_mask_type"] == "padding_causal"
    assert forward["cu_seqlens_q"].dtype == torch.int32
    assert torch.equal(forward["cu_seqlens_kv"], cu.to(torch.int32))
    assert forward["max_seqlen_q"] == int((cu[1:] - cu[:-1]).max())

    sc, init, forward = _dpa_args("random-padding-garbage")
    mask = forward["attention_mask"]  # [b, 1, 1, s], True = padding (masked out)
    b, s = sc.q.shape[:2]
    assert mask.shape == (b, 1, 1, s) and "attention_type" not in init
    assert torch.equal(mask.reshape(-1), ~sc.protected)

    sc, init, forward = _dpa_args("random-window-outside")
    assert init["window_size"] == sc.kwargs["window_size"] and forward == {}


def test_dpa_arguments_of_cross_attention_padding_and_unknown_kwargs():
    q, k = torch.zeros(2, 8, 1, 64), torch.zeros(2, 12, 1, 64)
    kw = dict(qkv_format="bshd", attn_mask_type="padding", seqlens_q=[8, 5], seqlens_kv=[12, 3])
    init, forward = audit_te.dpa_arguments(kw, q, k, k)
    mask_q, mask_kv = forward["attention_mask"]
    assert init["attention_type"] == "cross"
    assert mask_q.shape == (2, 1, 1, 8) and mask_kv.shape == (2, 1, 1, 12)
    assert int(mask_kv[1].sum()) == 9 and int(mask_q[0].sum()) == 0
    with pytest.raises(ValueError, match="quant"):
        audit_te.dpa_arguments(dict(quant=None), q, k, k)


def _fake_te_runner(path):
    """TE stand-in: reference numerics, upstream-delayed as BF16, upstream-mxfp8 not runnable."""
    if path == "upstream-mxfp8":
        raise audit_te.NotRunnable("needs compute capability >= 10.0")
    ref = audit._reference_runner("bf16" if path == "upstream-delayed" else path)

    def run(q, k, v, kw):
        return ref(q, k, v, kw)[0], "TE fake"

    return run


@pytest.fixture
def fake_te_mode(monkeypatch):
    monkeypatch.setattr(audit_te, "te_runner", _fake_te_runner)
    monkeypatch.setattr(audit, "_resolve_mode", lambda device: ("te", ""))
    monkeypatch.setattr(audit_te, "te_environment", lambda: ["gpu=fake"])


def test_te_mode_rows_json_and_exit_status(fake_te_mode, tmp_path, capsys):
    out = tmp_path / "audit.json"
    argv = ["--device", "cuda", "--scenarios", "report-mx-same-block", "report-current-future"]
    rc = audit.main(argv + ["--json", str(out)])
    rows = {(r["path"], r["scenario"]): r for r in json.loads(out.read_text())}
    assert rc == 0 and len(rows) == 6 * 2
    mx = rows[("upstream-mxfp8", "report-mx-same-block")]
    assert (mx["max_abs"], mx["changed"], mx["exact"]) == (None, None, None)
    assert mx["backend"] == "not runnable here" and "10.0" in mx["note"]
    assert rows[("upstream-current", "report-current-future")]["exact"] is False
    assert rows[("upstream-delayed", "report-current-future")]["exact"] is True
    assert "note" not in rows[("fork-current", "report-current-future")]
    text = capsys.readouterr().out
    assert "gpu=fake" in text and "n/a" in text and "2 not run here" in text


def test_te_mode_fails_when_a_fork_path_cannot_run(fake_te_mode, monkeypatch):
    """A fork path that does not run is not exact: the audit must exit non-zero."""

    def runner(path):
        if path == "fork-current":
            raise audit_te.NotRunnable("this transformer_engine is not the fork")
        return _fake_te_runner(path)

    monkeypatch.setattr(audit_te, "te_runner", runner)
    rc = audit.main(
        [
            "--device",
            "cuda",
            "--paths",
            "bf16",
            "fork-current",
            "--scenarios",
            "report-mx-next-block",
        ]
    )
    assert rc == 1


def test_fork_backend_names_the_kernels_and_refuses_a_fallback():
    out = torch.zeros(4)
    ran = audit_te.status.MaskExactStatus(
        mask_exact_calls=1, last_kernel_backend="triton", last_recipe="current"
    )
    assert audit_te.fork_backend(ran, out, out.clone()) == (
        "TE fork dispatch: mask-exact kernels (triton, recipe current); output == BF16 bitwise"
    )
    assert audit_te.fork_backend(ran, out, out + 1).endswith("output != BF16 (FP8)")
    fell_back = audit_te.status.MaskExactStatus(fallbacks={"Triton is not installed": 1})
    with pytest.raises(audit_te.NotRunnable, match="BF16/FP16 attention instead.*Triton"):
        audit_te.fork_backend(fell_back, out, out.clone())
    with pytest.raises(audit_te.NotRunnable, match="no call asked"):
        audit_te.fork_backend(audit_te.status.MaskExactStatus(), out, out.clone())
