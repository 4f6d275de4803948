"""Where the host time of one small CUDA-backend forward goes: each piece of the call alone.

    python benchmarks/attention/bench_host_breakdown.py

b=1 s=128 h=1 d=128 causal bf16 (the host-time shape of bench_host_time.py). Each row is the host
microseconds per call of one piece, calls back to back (synchronize only around the loop), best
of three round-robin rounds of five medians. The extension rows replay the exact arguments the launcher passed
(recorded from one call), so they time the binding and its launches without the Python around
them. Needs an sm90 GPU and the extension built with the sm_90a kernel.
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import (  # noqa: E402
    kernels,
    quantize,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.cuda import (  # noqa: E402
    attention,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (  # noqa: E402
    host_us_per_call,
)

KW = dict(recipe="current", qkv_format="bshd", attn_mask_type="causal")
CALLS = 3000


def host_us(fn) -> float:
    """Host microseconds per call (testing.host_us_per_call, median of 5 loops) after 50 calls."""
    for _ in range(50):
        fn()
    return host_us_per_call(fn, calls=CALLS, repeats=5)


def replay(call):
    """A function that repeats the first extension call `call` makes, with the same arguments."""
    recorded = []
    launch = quantize._launch

    def recording(x, kernel, *args):
        recorded.append((kernel, args))
        return launch(x, kernel, *args)

    quantize._launch = recording
    try:
        call()
    finally:
        quantize._launch = launch
    kernel, args = recorded[0]
    stream = quantize._raw_stream(torch.cuda.current_device())
    return lambda: kernel(*args, stream)


def main():
    if not (torch.cuda.is_available() and kernels.backend_available("cuda")):
        print("needs an sm90 GPU and the extension with the sm_90a kernel")
        return 1
    q, k, v = (torch.randn(1, 128, 1, 128, device="cuda").bfloat16() for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    ops = attention.quantize_operands(q, k, v, qkv_format="bshd")
    out, lse = torch.empty_like(q), torch.empty(1, 128, device="cuda")
    forward = lambda: kernels.attention_forward(q, k, v, backend="cuda", **KW)  # noqa: E731
    rows = {
        "fork cuda: the whole call": forward,
        "forward_supported (no backend checks)": lambda: attention.forward_supported(q, k, v, **KW),
        "the argument checks (_refusal)": lambda: attention._refusal(q, k, v, KW),
        "extension: casts + kernel (one call)": replay(forward),
        "extension: the kernel alone": replay(lambda: attention.launch(ops, out, lse, True, 0.1)),
        "extension: one per-token cast": replay(
            lambda: quantize.per_token_cast_to_fp8(q, qkv_format="bshd")
        ),
        "torch.empty (1 KiB)": lambda: torch.empty(1024, dtype=torch.uint8, device="cuda"),
        "torch.add (one launch through torch)": lambda: torch.add(q, q),
    }
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):  # entered once, as bench_host_time.py does
        rows["sdpa cudnn"] = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        runs = {name: [] for name in rows}
        for _ in range(3):  # round-robin, so that no row alone meets a cold or a busy host
            for name, fn in rows.items():
                runs[name].append(host_us(fn))
        best = {name: min(times) for name, times in runs.items()}
    print(f"Host us per call, b=1 s=128 h=1 d=128 causal bf16 ({torch.cuda.get_device_name()})")
    print("\n| piece | host us/call |\n|---|---|")
    for name, us in best.items():
        print(f"| {name} | {us:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
