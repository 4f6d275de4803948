"""benchmarks/attention/ncu_summary.py on a small source page in Nsight Compute's CSV layout."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "attention"))

import ncu_summary  # noqa: E402

PAGE = """\
"Kernel Name","attention_fwd_kernel(KernelParams)",
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_wait","stall_barrier","stall_barrier (Not Issued)"
"0x10","FMUL R1, R2, R3","30","1,000","20","10","9"
"0x20","@!P0  BRA 0x40","60","200","0","60","60"
"0x30","MUFU.EX2 R4, R4","10","600","10","0","0"
"0x40","FMUL R5, R6, R7","0","400","0","0","0"
"""


def test_summary_counts_reasons_instructions_and_opcodes(tmp_path):
    path = tmp_path / "source.csv"
    path.write_text(PAGE)
    text = ncu_summary.summarize(path, per=10, top=5)
    lines = text.splitlines()
    assert lines[0] == "warp-state samples: 100"
    # reasons by share (the Not Issued column is not a reason of its own)
    assert "| barrier | 70.0 % |" in lines and "| wait | 30.0 % |" in lines
    assert not any("Not Issued" in line for line in lines)
    # the instruction with the most samples first, predicate stripped for its opcode
    table = [line for line in lines if line.startswith("| 60 ")]
    assert table and "BRA" in table[0] and "barrier 60" in table[0]
    # opcodes: executed counts summed per opcode and divided by --per
    assert "| (all) | 220.0 |" in lines
    assert "| FMUL | 140.0 |" in lines and "| BRA | 20.0 |" in lines and "| MUFU | 60.0 |" in lines
