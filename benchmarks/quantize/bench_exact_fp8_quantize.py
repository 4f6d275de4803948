"""Achieved bandwidth of the mask-exact FP8 quantization kernels next to a device-to-device copy.

    python benchmarks/quantize/bench_exact_fp8_quantize.py [--output PATH]

Shape: b=2, s=8192, h=16, d=128, bshd, bf16 (64 MiB per input). Bandwidth counts the bytes each
kernel must read and write (input, FP8 data, scales, cu_chunks); the copy moves the same input
(read + write). Timing: CUDA graphs of 16 calls, rotating over 4 inputs (256 MiB, more than the
L2 cache, so every call reads from HBM), median of 10 replays; kernel time only. The eager column
is the time per call of the Python API (validation, allocation, launch) issued back to back.
The target is >= 80% of the copy's bandwidth.
"""

import argparse
import datetime
import statistics
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import (
    quantize as Q,
)  # noqa: E402

BATCH, SEQLEN, HEADS, HEAD_DIM = 2, 8192, 16, 128
INPUTS = 4
CALLS_PER_GRAPH = 16
REPLAYS = 10
TARGET = 0.80


def _graph_seconds(step, inputs: int = INPUTS) -> float:
    """Median seconds per call of step(i) over REPLAYS replays of a graph of CALLS_PER_GRAPH,
    i rotating over `inputs` inputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(inputs):  # warm-up outside the capture
            step(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS_PER_GRAPH):
            step(i % inputs)
    graph.replay()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / CALLS_PER_GRAPH)
    return statistics.median(times)


def _eager_seconds(step, calls: int = 64) -> float:
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(calls):
        step(i % INPUTS)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / calls


def _cases(xs):
    """(name, step, bytes moved) per kernel, and the copy."""
    t, h, d = BATCH * SEQLEN, HEADS, HEAD_DIM
    elems = t * h * d
    chunks_current = BATCH * (SEQLEN // Q.V_CHUNK_CURRENT)
    chunks_mx = BATCH * (SEQLEN // 32)
    t_pad = -(-t // Q.TOKEN_PAD) * Q.TOKEN_PAD
    read = 2 * elems
    dsts = [torch.empty_like(x) for x in xs]
    fmt = dict(qkv_format="bshd", backend="cuda")
    return [
        ("d2d copy (reference)", lambda i: dsts[i].copy_(xs[i]), 2 * read),
        (
            "per_token_cast_to_fp8 (Q, K)",
            lambda i: Q.per_token_cast_to_fp8(xs[i], **fmt),
            read + elems + 4 * t * h,
        ),
        (
            "per_block_cast_to_mxfp8_rowwise (Q, K)",
            lambda i: Q.per_block_cast_to_mxfp8_rowwise(xs[i], **fmt),
            read + elems + elems // 32,
        ),
        (
            "per_chunk_cast_to_fp8_transposed (V)",
            lambda i: Q.per_chunk_cast_to_fp8_transposed(xs[i], **fmt),
            read + h * d * t_pad + 4 * h * chunks_current + 4 * (BATCH + 1),
        ),
        (
            "per_chunk_cast_to_mxfp8_columnwise_transposed (V)",
            lambda i: Q.per_chunk_cast_to_mxfp8_columnwise_transposed(xs[i], **fmt),
            read + h * d * t_pad + h * chunks_mx * d + 4 * (BATCH + 1),
        ),
    ]


def _versions() -> str:
    props = torch.cuda.get_device_properties(0)
    try:
        nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
        nvcc = nvcc.strip().splitlines()[-1]
    except OSError:
        nvcc = "nvcc not found"
    return (
        f"- device: {props.name}, {props.multi_processor_count} SMs,"
        f" {props.total_memory / 2**30:.0f} GiB\n"
        f"- torch {torch.__version__} (CUDA {torch.version.cuda}), {nvcc}\n"
        f"- Python {sys.version.split()[0]}"
    )


def run() -> str:
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (BATCH, SEQLEN, HEADS, HEAD_DIM)
    xs = [torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    rows = []
    copy_bw = None
    for name, step, nbytes in _cases(xs):
        seconds = _graph_seconds(step)
        eager = _eager_seconds(step)
        bandwidth = nbytes / seconds / 1e9
        copy_bw = copy_bw or bandwidth
        ratio = bandwidth / copy_bw
        verdict = "" if name.startswith("d2d") else ("ok" if ratio >= TARGET else "BELOW TARGET")
        rows.append(
            f"| {name} | {nbytes / 2**20:.1f} | {seconds * 1e6:.1f} | {bandwidth:.0f} |"
            f" {100 * ratio:.0f}% | {eager * 1e6:.1f} | {verdict} |"
        )
    header = (
        "| kernel | MiB moved | us (graph) | GB/s | vs copy | us/call (eager API) | >= 80% |\n"
        "|---|---|---|---|---|---|---|"
    )
    return header + "\n" + "\n".join(rows)


def main() -> int:
    shape = f"- shape: b={BATCH}, s={SEQLEN}, h={HEADS}, d={HEAD_DIM}, bshd, bf16\n"
    return report_main(
        "Quantization kernels: achieved bandwidth", __doc__, run, "quantize_bandwidth.md", shape
    )


def report_main(title: str, doc: str, run_table, default_name: str, extra: str = "") -> int:
    """A bandwidth benchmark's command line: --output (default benchmarks/results/<default_name>),
    the GPU and extension check, then write_report of run_table()'s table."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument(
        "--output",
        type=Path,
        default=ROOT / "benchmarks" / "results" / default_name,
        help="markdown file the results are written to",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available() or not Q.extension_available():
        print("needs a CUDA GPU and the transformer_engine_exact_fp8 extension", file=sys.stderr)
        return 1
    write_report(title, doc, run_table(), args.output, extra)
    return 0


def write_report(title: str, doc: str, table: str, output: Path, extra: str = "") -> None:
    """The markdown record (title, date, versions, command, the method from the module doc's
    third paragraph on, the table) to `output`, and printed."""
    command = "python " + " ".join(sys.argv)
    report = (
        f"# {title}\n\n"
        f"- date: {datetime.date.today().isoformat()}\n{_versions()}\n"
        f"{extra}- command: `{command}`\n\n"
        f"{doc.split(chr(10) + chr(10), 2)[2].strip()}\n\n{table}\n"
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(report)
    print(report)


if __name__ == "__main__":
    sys.exit(main())
