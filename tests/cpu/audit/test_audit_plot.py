"""The causality audit's plot: prefix change vs distance of the perturbed token (CPU mode)."""

import json

import pytest

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.audit import (
    cli as audit,
    plot as audit_plot,
    te_runner as audit_te,
)

pytest.importorskip("matplotlib", reason="the PNG needs matplotlib (requirements-test.txt)")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_plot_writes_a_png_and_the_sweep_shows_the_leaks(tmp_path):
    png, data = tmp_path / "audit.png", tmp_path / "sweep.json"
    argv = ["--device", "cpu", "--paths", "bf16", "upstream-current", "upstream-mxfp8"]
    argv += ["fork-mxfp8", "--scenarios", "report-mx-next-block", "--max-distance", "64"]
    rc = audit.main(argv + ["--plot", str(png), "--plot-data", str(data)])
    assert rc == 0
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == PNG_SIGNATURE
    sweep = json.loads(data.read_text())
    assert sweep["distances"] == [1, 2, 4, 8, 16, 32, 64]
    paths = sweep["paths"]
    assert all(m == 0 for p in ("bf16", "fork-mxfp8") for m in paths[p]["max_abs"])
    assert all(m > 0 for m in paths["upstream-current"]["max_abs"])
    # The prefix ends 15 tokens into a 32-token MXFP8 block: distances 1..16 share its V block.
    mx = paths["upstream-mxfp8"]["max_abs"]
    assert all(m > 0 for m in mx[:5]) and all(m == 0 for m in mx[5:])


def test_plot_from_saved_data_with_a_path_that_did_not_run(tmp_path):
    """A not-runnable path is listed under the plot, not drawn; the CLI draws saved data."""

    def make_runner(path):
        if path == "upstream-mxfp8":
            raise audit_te.NotRunnable("needs compute capability >= 10.0")
        return audit._reference_runner(path)

    sweep = audit_plot.distance_sweep(make_runner, ["bf16", "upstream-mxfp8"], max_distance=4)
    assert sweep["paths"]["upstream-mxfp8"]["max_abs"] is None
    assert "not run" in audit_plot.format_sweep(sweep)
    data, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    audit_plot.save(sweep, data=str(data))
    assert audit_plot.main([str(data), str(png)]) == 0
    assert png.read_bytes()[:8] == PNG_SIGNATURE


def test_sweep_distances_are_powers_of_two():
    assert audit_plot.sweep_distances(8) == [1, 2, 4, 8]
    with pytest.raises(ValueError):
        audit_plot.sweep_distances(48)
