"""The Transformer Engine side of mask-exact FP8 attention.

backend       `dispatch`, the entry point patch 0003 calls from DotProductAttention.forward
autograd      the autograd function: FP8 forward kernel, the fork's backward kernels
recipe        the recipe field fp8_dpa_mask_exact and which rules a recipe selects
selection     what upstream's get_attention_backend reports for the fork's configurations (patch 0005)
status        did mask-exact FP8 attention run: calls, fallbacks by reason, the last kernel backend
"""
