"""Mask-exact FP8 dot-product attention: FP8 attention whose quantization scales never reduce over
a token that the attention mask hides. See Note [Mask-exact FP8 scaling] in formats.py.

The rules and the quantization API sit at this level; each other concern has its folder
(docs/architecture.md draws the tree and the path of one call):

  formats.py    the FP8 formats, their casts and the Note
  masks.py      sequence layouts (bshd/sbhd/thd tokens) and mask geometry
  vt_layout.py  where each sequence's keys sit in V8^T, the FP8 V operand
  quantize.py   the quantization API over the CUDA extension
  kernels.py    `attention_forward`, the one entry point that chooses the kernel backend
  testing.py    numeric helpers shared by tests, benchmarks and the audit
  triton/       the Triton kernel backend
  cuda/         the sm90 CUDA (CuTe) kernel backend, not selected by default yet
  context_parallel/  context parallelism: the ring's chunking, payload, steps and merge
  te/           Transformer Engine glue: dispatch, autograd, recipe
  reference/    the pure-PyTorch oracle
  audit/        the causality audit CLI
"""
