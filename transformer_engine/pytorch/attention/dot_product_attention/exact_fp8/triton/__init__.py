"""The Triton backend of mask-exact FP8 attention: the portable kernels (sm89+, and the CPU
interpreter in tests), forward and backward.

  attention         the launcher: checks, K/V quantization, TMA descriptors, the grid
  attention_kernel  the forward kernel
  masking           in-kernel mask geometry (mirrors masks.py)
  scaling           in-kernel FP8 scale rules (bit for bit those of formats.py)
  backward          the backward's launcher: Q/K quantization (the forward's operands), grids
  backward_kernel   the backward kernels (D and LSE2, dK/dV, dQ)
"""
