"""The causality audit (te-fp8-causality-audit): does any FP8 attention path let a token that the
mask hides change an output? A tool, not part of the production path.

  cli           the command line and the table
  scenarios     base inputs and the perturbations of hidden tokens
  te_runner     every path through TE's own DotProductAttention (the GPU mode)
  plot          prefix change against the perturbed token's distance
"""
