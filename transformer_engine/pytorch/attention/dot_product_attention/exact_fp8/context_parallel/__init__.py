"""Mask-exact FP8 attention under context parallelism (docs/context_parallel.md).

  chunking   TE's load-balanced causal split (rank r holds chunks r and 2 cp - 1 - r) and the
             section of every ring step (diagonal, lower-triangle, upper-triangle, all)
  payload    K and V as they travel the ring: FP8 data plus per-token K and per-chunk V scales
  steps      one ring step through kernels.attention_forward, with that step's mask
  combine    the LSE merge of the steps' partial results, as TE's ring merges them
  ring       one rank's ring forward (and the backward's gradient accumulation) over a
             send/receive callable and a per-step function
  simulate   every rank of a ring in one process, ranks simulated by splitting the sequence
  a2a        the head split of cp_comm_type="a2a" (each rank sees whole sequences)

Nothing here communicates by itself: TE's AttnFuncWithCPAndKVP2P / AttnFuncWithCPAndQKVOA2A keep
the communication; this package is what their per-step calls would run (docs/context_parallel.md).
"""
