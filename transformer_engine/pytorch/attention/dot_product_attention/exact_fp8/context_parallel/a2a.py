"""cp_comm_type="a2a" (TE's AttnFuncWithCPAndQKVOA2A): heads exchanged, whole sequences per rank.

TE's all-to-all turns each rank's [b, s / cp, h, d] into [b, s, h / cp, d] (sequence chunks put
back in order), so every rank attends whole sequences for h / cp heads (h_kv / cp kv-heads) and
the fork's kernel runs unchanged on them. Every scale of Note [Mask-exact FP8 scaling] reduces
within one (kv-)head, so a rank's heads quantize exactly as in the single call: the a2a output is
the single call's, bit for bit, head by head (tested). Rank r gets query heads
[r h / cp, (r + 1) h / cp) and kv-heads [r h_kv / cp, (r + 1) h_kv / cp): GQA groups stay whole.
"""

from typing import Tuple

__all__ = ["head_split"]


def head_split(rank: int, cp_size: int, heads: int, kv_heads: int) -> Tuple[slice, slice]:
    """(query heads, kv-heads) of `rank` after the a2a; ValueError unless cp divides both."""
    if heads % cp_size or kv_heads % cp_size:
        raise ValueError(
            f"a2a context parallelism needs cp_size ({cp_size}) to divide the query heads"
            f" ({heads}) and the kv-heads ({kv_heads})"
        )
    hq, hk = heads // cp_size, kv_heads // cp_size
    return slice(rank * hq, (rank + 1) * hq), slice(rank * hk, (rank + 1) * hk)
