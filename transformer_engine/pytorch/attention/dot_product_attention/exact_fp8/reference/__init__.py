"""The oracle: pure-PyTorch numerics of the fork's mask-exact rules and of upstream's leaky ones.

  quantize      the quantization rules (per token, per chunk, MXFP8) and upstream's one-amax rule
  attention     attention over the quantized operands in fp64, every path of the audit
  backward      the straight-through backward of the fork's attention in fp64

Tests, benchmarks and the audit compare the kernels against it; the production path never
imports it (the quantization API's CPU fallback reaches it through quantize._reference_cast).
Runs without a GPU and without TE's core library.
"""
