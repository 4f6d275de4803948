"""The causality audit's CPU mode: table, JSON rows, exit status."""

import json

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import audit


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
    real = audit._reference_runner
    monkeypatch.setattr(
        audit,
        "_reference_runner",
        lambda path: real("upstream-current" if path == "fork-current" else path),
    )
    rc = audit.main(
        ["--device", "cpu", "--paths", "fork-current", "--scenarios", "report-current-future"]
    )
    assert rc == 1
