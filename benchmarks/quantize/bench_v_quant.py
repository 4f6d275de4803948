"""Achieved bandwidth of the V quantization kernels next to a device-to-device copy of the same V.

    python benchmarks/quantize/bench_v_quant.py [--output PATH]

Shapes (bf16, d = 128): bshd b=2, h_kv=16 at s = 4k, 8k, 16k; GQA b=1, h_kv=8, s=16k; and a thd
pack of 2 x 8k tokens in 23 sequences of uneven lengths, h_kv=16, quantized the way the attention
launcher does it (aligned columns, offsets on the device, sync_free). Per shape, in one run: the
copy (`torch.Tensor.copy_` of V: read + write), per_chunk_cast_to_fp8_transposed (current
scaling, 128-token chunks) and, for reference, per_chunk_cast_to_mxfp8_columnwise_transposed.
A kernel's bytes are V's real tokens read plus everything it writes (data_t with its padding
columns, the scales of the real chunks). Timing: CUDA graphs of 16 calls rotating over enough
inputs (>= 256 MiB, more than the L2 cache) that every call reads from HBM, median of 10
replays; kernel time only. The target is >= 80% of the copy's bandwidth for the current-scaling
kernel.
"""

import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, also under PYTHONSAFEPATH

from bench_exact_fp8_quantize import _graph_seconds, report_main  # noqa: E402
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import (  # noqa: E402
    quantize as Q,
)

HEAD_DIM = 128
ROTATION_BYTES = 256 * 2**20
TARGET = 0.80
# (name, qkv_format, batch, seqlen, h_kv)
SHAPES = (
    ("bshd b=2 h_kv=16 s=4k", "bshd", 2, 4096, 16),
    ("bshd b=2 h_kv=16 s=8k", "bshd", 2, 8192, 16),
    ("bshd b=2 h_kv=16 s=16k", "bshd", 2, 16384, 16),
    ("bshd GQA b=1 h_kv=8 s=16k", "bshd", 1, 16384, 8),
    ("thd 23 seqs, 16k tokens, h_kv=16", "thd", 1, 16384, 16),
)
THD_SEQS = 23


def _thd_cu_seqlens(tokens: int, gen: torch.Generator) -> torch.Tensor:
    """[THD_SEQS + 1] int32 on the GPU: uneven lengths (most not multiples of 16) that fill
    `tokens`."""
    weights = torch.rand(THD_SEQS, generator=gen) + 0.2
    lens = (weights / weights.sum() * tokens).floor().to(torch.int64)
    lens[-1] += tokens - lens.sum()
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    return cu.to(torch.int32).cuda()


def _inputs(qkv_format, batch, seqlen, heads, gen):
    """Enough V tensors to rotate through more than the L2 cache, and the call's keywords."""
    shape = (seqlen, heads, HEAD_DIM) if qkv_format == "thd" else (batch, seqlen, heads, HEAD_DIM)
    one = math.prod(shape) * 2
    count = max(2, -(-ROTATION_BYTES // one))
    vs = [torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)]
    vs += [torch.randn_like(vs[0]) for _ in range(count - 1)]
    if qkv_format != "thd":
        return vs, dict(qkv_format=qkv_format, backend="cuda")
    cu = _thd_cu_seqlens(seqlen, torch.Generator().manual_seed(seqlen))
    kw = dict(qkv_format="thd", cu_seqlens=cu, aligned_columns=True, sync_free=True)
    return vs, dict(kw, backend="cuda")


def _cast_bytes(v: torch.Tensor, outputs, scale_bytes_per_chunk: int) -> int:
    """V's bytes read (all its tokens are real here) + data_t + the real chunks' scales."""
    data_t, _, cu_chunks = outputs  # cu_chunks [num_seqs + 1]: the last entry counts the chunks
    real_chunks = int(cu_chunks[-1])
    return v.numel() * 2 + data_t.numel() + data_t.shape[0] * real_chunks * scale_bytes_per_chunk


def _offsets(kw, chunk):
    """The thd offsets the attention launcher computes once (outside the timed calls)."""
    if kw["qkv_format"] != "thd":
        return {}
    return dict(offsets=Q.sequence_offsets(kw["cu_seqlens"], chunk))


def _shape_rows(name, qkv_format, batch, seqlen, heads, gen):
    vs, kw = _inputs(qkv_format, batch, seqlen, heads, gen)
    dsts = [torch.empty_like(v) for v in vs]
    n = len(vs)
    current_kw = dict(kw, **_offsets(kw, Q.V_CHUNK_CURRENT))
    mx_kw = dict(kw, **_offsets(kw, 32))
    current = lambda i: Q.per_chunk_cast_to_fp8_transposed(vs[i], **current_kw)  # noqa: E731
    mxfp8 = lambda i: Q.per_chunk_cast_to_mxfp8_columnwise_transposed(vs[i], **mx_kw)  # noqa: E731
    cases = [
        ("d2d copy of V", lambda i: dsts[i].copy_(vs[i]), 4 * vs[0].numel()),
        ("per_chunk_cast_to_fp8_transposed", current, _cast_bytes(vs[0], current(0), 4)),
        (
            "per_chunk_cast_to_mxfp8_columnwise_transposed",
            mxfp8,
            _cast_bytes(vs[0], mxfp8(0), HEAD_DIM),
        ),
    ]
    rows, copy_bw = [], None
    for kernel, step, nbytes in cases:
        seconds = _graph_seconds(step, n)
        bandwidth = nbytes / seconds / 1e9
        copy_bw = copy_bw or bandwidth
        ratio = bandwidth / copy_bw
        verdict = ""
        if kernel == "per_chunk_cast_to_fp8_transposed":
            verdict = "ok" if ratio >= TARGET else "BELOW TARGET"
        rows.append(
            f"| {name} | {kernel} | {nbytes / 2**20:.1f} | {seconds * 1e6:.1f} |"
            f" {bandwidth:.0f} | {100 * ratio:.0f}% | {verdict} |"
        )
    return rows


def run() -> str:
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for shape in SHAPES:
        rows += _shape_rows(*shape, gen)
        torch.cuda.empty_cache()  # the shape's inputs are gone
        print(rows[-2], flush=True)
    header = (
        "| shape | kernel | MiB moved | us (graph) | GB/s | vs copy | >= 80% |\n"
        "|---|---|---|---|---|---|---|"
    )
    return header + "\n" + "\n".join(rows)


def main() -> int:
    return report_main(
        "V quantization: achieved bandwidth next to a copy", __doc__, run, "v_quant_bandwidth.md"
    )


if __name__ == "__main__":
    sys.exit(main())
