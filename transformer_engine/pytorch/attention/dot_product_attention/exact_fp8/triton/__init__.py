"""The Triton backend of mask-exact FP8 attention: the portable kernel (sm89+, and the CPU
interpreter in tests).

  attention         the launcher: checks, K/V quantization, TMA descriptors, the grid
  attention_kernel  the forward kernel
  masking           in-kernel mask geometry (mirrors masks.py)
  scaling           in-kernel FP8 scale rules (bit for bit those of formats.py)
  qk_roundtrip      Q and K through the forward's rules and back, for the BF16 backward
"""
