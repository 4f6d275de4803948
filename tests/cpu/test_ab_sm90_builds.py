"""benchmarks/attention/ab_sm90_builds.py: the rotation of builds over rounds, the medians and
ratios of its table, and its argument checks (the GPU rounds stood in for)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "attention"))

import ab_sm90_builds as ab  # noqa: E402

SPEED = {"base": [500.0, 520.0, 510.0], "new": [600.0, 590.0, 640.0]}  # TFLOPS per round


def test_rounds_rotate_the_builds_and_the_table_takes_medians(tmp_path, monkeypatch):
    calls = []

    def fake_round(name, lib, entries, out, r, head_dim):
        calls.append(name)
        assert head_dim == 128
        return [dict(shape=[2, 16, 16, 8192], entry="cuda kernel", ms=1.0, tflops=SPEED[name][r])]

    monkeypatch.setattr(ab, "run_round", fake_round)
    libs = [("base", tmp_path), ("new", tmp_path)]
    table = ab.ab_table(libs, 3, "cuda kernel", tmp_path)
    assert calls == ["base", "new", "new", "base", "base", "new"]
    assert table[((2, 16, 16, 8192), "cuda kernel")] == SPEED
    text = ab.markdown(table, ["base", "new"], 3)
    assert "| 2, 16, 16, 8k | cuda kernel | 510 | 600 (1.176x) |" in text


def test_the_head_dim_reaches_every_round_and_the_table(tmp_path, monkeypatch):
    dims = []

    def fake_round(name, lib, entries, out, r, head_dim):
        dims.append(head_dim)
        return [dict(shape=[2, 16, 16, 8192], entry="cuda kernel", ms=1.0, tflops=SPEED[name][r])]

    monkeypatch.setattr(ab, "run_round", fake_round)
    table = ab.ab_table([("base", tmp_path), ("new", tmp_path)], 2, "cuda kernel", tmp_path, 64)
    assert dims == [64] * 4
    assert "causal bshd bf16 d=64;" in ab.markdown(table, ["base", "new"], 2, 64)


def test_a_build_missing_from_a_row_shows_a_dash():
    table = {((1, 64, 8, 16384), "cuda"): {"base": [700.0]}}
    assert "| 1, 64, 8, 16k | cuda | 700 | - |" in ab.markdown(table, ["base", "new"], 1)


@pytest.mark.parametrize("lib", ["nodir", "x=/no/such/folder", "=/tmp"])
def test_bad_lib_arguments_exit_2(lib, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        ab.main(["--out", str(tmp_path), "--lib", lib])
    assert exit_info.value.code == 2


def test_repeated_names_exit_2(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        ab.main(["--out", str(tmp_path), "--lib", f"a={tmp_path}", "--lib", f"a={tmp_path}"])
    assert exit_info.value.code == 2
