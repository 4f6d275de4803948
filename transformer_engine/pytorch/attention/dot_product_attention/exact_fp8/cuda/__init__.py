"""The CUDA C++ backend of mask-exact FP8 attention: the Hopper (sm_90a) kernel of
transformer_engine/common/fused_attn/exact_fp8_attention_sm90/ (CuTe: TMA + WGMMA FP8).

  attention   the launcher: checks, Q/K/V quantization, the call into the extension

kernels.choose_backend runs it for the calls it supports on sm90 (docs/attention_kernel_sm90.md).
"""
