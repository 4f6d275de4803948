"""TE's load-balanced causal chunking and the mask of every ring step. Pure, data independent.

The sequence of each sample (length s) is cut into 2 * cp chunks of L = s / (2 cp) tokens; rank
r holds chunks r and 2 cp - 1 - r, in that order, as one local sequence of 2 L tokens (TE's
get_batch_on_this_cp_rank). In the ring (TE's AttnFuncWithCPAndKVP2P) rank r receives at step i
the K and V of rank src = (r - i) mod cp and computes, with a causal mask:

  step 0 (src == r)     "diagonal":        all local queries x all src keys, causal (top-left
                                           over the 2 L local tokens: chunk r sees itself
                                           causally, chunk 2cp-1-r sees chunk r entirely and
                                           itself causally)
  0 < i <= r (src < r)  "lower-triangle":  all local queries x the src's first chunk (chunk src),
                                           no mask; its second chunk (2cp-1-src > 2cp-1-r) is
                                           hidden from both local chunks
  i > r (src > r)       "upper-triangle":  the second local chunk (2cp-1-r) x all src keys, no
                                           mask; the first local chunk (r < src) sees nothing

and without a causal mask every step is "all" (all queries x all keys, the call's own mask).

Every (query, key) pair a global causal mask allows is computed in exactly one step, and no other
(`global_pairs_of_step`, tested). Chunk lengths are multiples of CP_CHUNK_MULTIPLE = KV_TILE
(`check_seqlen`): then every chunk starts on a KV tile and on a V scale chunk (128 tokens for
current scaling, 32 for MXFP8), so that no V scale ever reduces over two chunks (two ranks'
shards, or the two shards of one rank), and a step's tiles are the single call's tiles (the same
FP8 / unquantized decision for every (query tile, KV tile) pair). Ragged lengths are refused:
TE's FP8 ring has no such case either (it needs s divisible by 2 cp), and a short chunk would
leave boundary tiles in the off-diagonal steps, whose unquantized V does not travel.
"""

from dataclasses import dataclass
from typing import Tuple

import torch

from ..formats import KV_TILE

__all__ = [
    "CP_CHUNK_MULTIPLE",
    "SECTIONS",
    "Section",
    "check_seqlen",
    "rank_chunks",
    "shard",
    "unshard",
    "step_section",
    "local_positions",
    "global_pairs_of_step",
]

CP_CHUNK_MULTIPLE = KV_TILE
"""Every load-balanced chunk holds a multiple of this many tokens (see the module doc)."""

SECTIONS = ("diagonal", "lower-triangle", "upper-triangle", "all")


def check_seqlen(seqlen: int, cp_size: int) -> int:
    """The chunk length L = seqlen / (2 cp); ValueError unless it is a positive multiple of
    CP_CHUNK_MULTIPLE."""
    if cp_size < 1:
        raise ValueError(f"cp_size must be >= 1, got {cp_size}")
    per_chunk, rest = divmod(seqlen, 2 * cp_size)
    if rest or per_chunk == 0 or per_chunk % CP_CHUNK_MULTIPLE:
        raise ValueError(
            f"mask-exact FP8 context parallelism needs sequence lengths that are multiples of"
            f" 2 * cp_size * {CP_CHUNK_MULTIPLE} = {2 * cp_size * CP_CHUNK_MULTIPLE} (each"
            f" load-balanced chunk a whole number of KV tiles and V scale chunks), got {seqlen}"
        )
    return per_chunk


def rank_chunks(rank: int, cp_size: int) -> Tuple[int, int]:
    """The two chunks (of 2 cp) that `rank` holds, in local order: (rank, 2 cp - 1 - rank)."""
    if not 0 <= rank < cp_size:
        raise ValueError(f"rank {rank} outside a group of {cp_size}")
    return rank, 2 * cp_size - 1 - rank


def shard(x: torch.Tensor, rank: int, cp_size: int, seq_dim: int) -> torch.Tensor:
    """x's tokens of `rank` (its two chunks along seq_dim, concatenated), contiguous."""
    chunks = x.chunk(2 * cp_size, dim=seq_dim)
    a, b = rank_chunks(rank, cp_size)
    return torch.cat([chunks[a], chunks[b]], dim=seq_dim).contiguous()


def unshard(parts, cp_size: int, seq_dim: int) -> torch.Tensor:
    """Inverse of shard: parts[r] = shard(x, r, cp_size, seq_dim) -> x."""
    chunks = [None] * (2 * cp_size)
    for rank, part in enumerate(parts):
        a, b = rank_chunks(rank, cp_size)
        chunks[a], chunks[b] = part.chunk(2, dim=seq_dim)
    return torch.cat(chunks, dim=seq_dim)


@dataclass(frozen=True)
class Section:
    """What one ring step computes on one rank.

    name: one of SECTIONS; kv_rank: whose K and V (src = (rank - step) mod cp); q_half: the local
    query rows, "both" or "second" (the chunk 2cp-1-rank); kv_half: the keys, "both" or "first"
    (the src's chunk src); causal: whether the step's kernel call is causal (top-left over the
    local tokens, diagonal only)."""

    name: str
    kv_rank: int
    q_half: str
    kv_half: str
    causal: bool


def step_section(rank: int, step: int, cp_size: int, causal: bool) -> Section:
    """The section rank `rank` computes at ring step `step` (TE's AttnFuncWithCPAndKVP2P)."""
    rank_chunks(rank, cp_size)
    if not 0 <= step < cp_size:
        raise ValueError(f"step {step} outside a ring of {cp_size}")
    src = (rank - step) % cp_size
    if not causal:
        return Section("all", src, "both", "both", False)
    if step == 0:
        return Section("diagonal", src, "both", "both", True)
    if step <= rank:
        return Section("lower-triangle", src, "both", "first", False)
    return Section("upper-triangle", src, "second", "both", False)


def local_positions(rank: int, cp_size: int, chunk_len: int, half: str = "both") -> torch.Tensor:
    """Global sequence positions of a rank's local tokens (int64), of both chunks or one half
    ("first", "second")."""
    a, b = rank_chunks(rank, cp_size)
    first = torch.arange(a * chunk_len, (a + 1) * chunk_len)
    second = torch.arange(b * chunk_len, (b + 1) * chunk_len)
    return {"both": torch.cat([first, second]), "first": first, "second": second}[half]


def global_pairs_of_step(section: Section, rank: int, cp_size: int, chunk_len: int):
    """(query positions, key positions, allowed [n_q, n_kv] bool) of one step in global sequence
    positions: the pairs the step's kernel call computes (for the plan's tests)."""
    q_pos = local_positions(rank, cp_size, chunk_len, section.q_half)
    kv_pos = local_positions(section.kv_rank, cp_size, chunk_len, section.kv_half)
    if section.causal:  # top-left causal over the local index (equal local lengths)
        i = torch.arange(q_pos.numel()).unsqueeze(1)
        j = torch.arange(kv_pos.numel()).unsqueeze(0)
        allowed = j <= i
    else:
        allowed = torch.ones(q_pos.numel(), kv_pos.numel(), dtype=torch.bool)
    return q_pos, kv_pos, allowed
