"""Mask-exact FP8 dot-product attention: FP8 attention whose quantization scales never reduce over
a token that the attention mask hides. See Note [Mask-exact FP8 scaling] in formats.py."""
