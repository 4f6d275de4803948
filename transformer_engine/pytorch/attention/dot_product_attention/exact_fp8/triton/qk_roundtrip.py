"""Q and K through the forward's FP8 rules and back: what the cuDNN backward gets instead of Q, K.

See Note [BF16 backward of the FP8 forward] in te/autograd.py for why. Two implementations of one
function, bit for bit equal (tests/pytorch/attention/test_exact_fp8_te.py checks it on the GPU):

  triton.qk_roundtrip.fp8_roundtrip     one Triton pass over a CUDA tensor (read once, write once)
  reference.quantize.fp8_roundtrip      the reference rules, any device (the oracle)

Both quantize every token's d channels with the mask-exact rules (see Note [Mask-exact FP8
scaling] in formats.py): one scale per token ("current") or one E8M0 scale per 32 channels
("mxfp8"), as the forward kernel quantizes Q and K, and dequantize in fp32, rounding once to the
input dtype.
"""

import torch
import triton
import triton.language as tl

from ..formats import MX_BLOCK, check_recipe
from .scaling import e8m0_to_fp32, per_block_cast_to_mxfp8, per_token_cast_to_fp8

__all__ = ["fp8_roundtrip"]

_ROWS_PER_PROGRAM = 16


def fp8_roundtrip(x: torch.Tensor, recipe: str, use_power_2_scales: bool) -> torch.Tensor:
    """reference.quantize.fp8_roundtrip in one Triton pass; x a CUDA tensor [..., d], bf16 or fp16."""
    check_recipe(recipe)
    d = x.shape[-1]
    if d % MX_BLOCK or d & (d - 1):
        raise ValueError(f"the head dim must be a power of two and a multiple of 32, got {d}")
    x = x.contiguous()
    out = torch.empty_like(x)
    rows = x.numel() // d
    grid = (triton.cdiv(rows, _ROWS_PER_PROGRAM),)
    _fp8_roundtrip_kernel[grid](
        x, out, rows, HEAD_DIM=d, ROWS=_ROWS_PER_PROGRAM, MX=recipe == "mxfp8",
        POWER_2=use_power_2_scales,
    )  # fmt: skip
    return out


@triton.jit
def _fp8_roundtrip_kernel(
    x_ptr, out_ptr, rows, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, MX: tl.constexpr,
    POWER_2: tl.constexpr,
):  # fmt: skip
    """ROWS tokens of x [rows, HEAD_DIM] per program; quantize and dequantize each token."""
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    offsets = row[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    keep = (row < rows)[:, None]
    x = tl.load(x_ptr + offsets, mask=keep, other=0.0).to(tl.float32)
    if MX:
        # See Note [Mask-exact FP8 scaling]: one E8M0 scale per 32 channels of one token.
        blocks = tl.reshape(x, (ROWS * HEAD_DIM // 32, 32))
        data, code = per_block_cast_to_mxfp8(blocks)
        y = tl.reshape(data.to(tl.float32) * e8m0_to_fp32(code)[:, None], (ROWS, HEAD_DIM))
    else:
        # See Note [Mask-exact FP8 scaling]: one scale per token, amax over its d channels.
        data, scale_inv = per_token_cast_to_fp8(x, 0.0, POWER_2)
        y = data.to(tl.float32) * scale_inv[:, None]
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=keep)
