"""tools/audit.sh, the README's audit command: matplotlib is installed for --plot only, the
arguments reach the audit unchanged, and the README's JSON output lands where git ignores it."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
AUDIT_MODULE = "transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.audit"

# A stand-in interpreter: torch imports, matplotlib does not (until pip installed it); every
# `-m` call is recorded instead of run.
FAKE_PYTHON = """#!/usr/bin/env bash
log="$FAKE_LOG"
if [ "$1" = "-c" ]; then
  case "$2" in
    *matplotlib*) [ -e "$FAKE_LOG.matplotlib" ] && exit 0; exit 1 ;;
    *) exit 0 ;;
  esac
fi
echo "$*" >> "$log"
if [ "$1 $2 $3" = "-m pip install" ]; then touch "$FAKE_LOG.matplotlib"; fi
"""


@pytest.fixture
def fake_python(tmp_path):
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return python, tmp_path / "calls.log"


def _audit_sh(fake_python, *args):
    python, log = fake_python
    env = dict(os.environ, PYTHON=str(python), FAKE_LOG=str(log))
    subprocess.run(["bash", str(ROOT / "tools/audit.sh"), *args], env=env, check=True)
    return log.read_text().splitlines()


@pytest.mark.parametrize("plot", [["--plot", "a.png"], ["--plot=a.png"]])
def test_plot_installs_matplotlib_when_missing(fake_python, plot):
    calls = _audit_sh(fake_python, "--device", "cpu", *plot)
    assert calls == [
        "-m pip install -q matplotlib",
        f"-m {AUDIT_MODULE} --device cpu {' '.join(plot)}",
    ]
    calls = _audit_sh(fake_python, *plot)  # now "installed": not again
    assert calls[2:] == [f"-m {AUDIT_MODULE} {' '.join(plot)}"]


def test_no_plot_installs_nothing(fake_python):
    calls = _audit_sh(fake_python, "--plot-data", "sweep.json", "--json", "plot.json")
    assert calls == [f"-m {AUDIT_MODULE} --plot-data sweep.json --json plot.json"]


def test_the_readme_audit_command_writes_where_git_ignores_it():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^bash tools/audit\.sh (.*)$", readme, flags=re.M)
    assert commands, "the README names the audit command"
    outputs = [m for c in commands for m in re.findall(r"--(?:json|plot|plot-data) (\S+)", c)]
    assert outputs
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for path in outputs:
        check = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", path])
        assert check.returncode == 0, f"{path} (README's audit command) is not ignored by git"
