"""Sequence layout and mask geometry of mask-exact FP8 attention: where each sequence's tokens
are (the qkv formats and `SeqLayout`), which positions a row may see, and which (query tile,
KV tile) pairs may use the FP8 copy of V. Pure PyTorch, data independent.

Mask types follow TE's `attn_mask_type` names. A sliding window (left, right) is TE's
`window_size`: row i sees keys j with i + off - left <= j <= i + off + right, where the diagonal
offset `off` is 0 for the top-left causal types and len_kv - len_q otherwise (TE's bottom-right
alignment, computed from the real lengths of each sequence). -1 means unbounded on that side.
Causal types force right = 0.
"""

from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple

import torch

from .formats import KV_TILE, Q_TILE

__all__ = [
    "MASK_TYPES",
    "QKV_FORMATS",
    "to_tokens",
    "from_tokens",
    "SeqLayout",
    "diagonal_offset",
    "allowed_positions",
    "fp8_tile_map",
    "check_mask_type",
    "sequence_masks",
]

MASK_TYPES = (
    "no_mask",
    "padding",
    "causal",
    "causal_bottom_right",
    "padding_causal",
    "padding_causal_bottom_right",
)
_TOP_LEFT = ("causal", "padding_causal")
QKV_FORMATS = ("bshd", "sbhd", "thd")


def check_mask_type(mask_type: str, window_size: Optional[Tuple[int, int]] = None) -> None:
    """Raise ValueError for a mask type or window this implementation does not support."""
    if mask_type not in MASK_TYPES:
        raise ValueError(
            f"Mask-exact FP8 attention supports attn_mask_type in {MASK_TYPES}, got {mask_type!r}"
            " ('arbitrary' masks carry no geometry to split V scales at)."
        )
    if window_size is not None and (len(window_size) != 2 or min(window_size) < -1):
        raise ValueError(f"window_size must be (left, right) with entries >= -1, got {window_size}")


def diagonal_offset(mask_type: str, len_q: int, len_kv: int) -> int:
    """Column of row 0's diagonal: 0 for top-left causal types, len_kv - len_q otherwise."""
    return 0 if mask_type in _TOP_LEFT else len_kv - len_q


def bshd_view(x: torch.Tensor, qkv_format: str) -> torch.Tensor:
    """A dense bshd [b, s, h, d] or sbhd [s, b, h, d] tensor as bshd: itself, or sbhd's transpose
    (a view; bshd_view of the result gives x back)."""
    if qkv_format == "bshd":
        return x
    if qkv_format == "sbhd":
        return x.transpose(0, 1)
    raise ValueError(f"qkv_format must be bshd or sbhd, got {qkv_format!r}")


def to_tokens(x: torch.Tensor, qkv_format: str) -> torch.Tensor:
    """bshd [b, s, h, d] / sbhd [s, b, h, d] / thd [t, h, d] -> tokens [t, h, d] (a view if possible)."""
    if qkv_format == "bshd":
        return x.flatten(0, 1)
    if qkv_format == "sbhd":
        return x.transpose(0, 1).flatten(0, 1)
    if qkv_format == "thd":
        return x
    raise ValueError(f"qkv_format must be one of {QKV_FORMATS}, got {qkv_format!r}")


def from_tokens(x: torch.Tensor, qkv_format: str, like: torch.Tensor) -> torch.Tensor:
    """tokens [t, h, d] -> the layout of `like` (bshd, sbhd or thd), contiguous for sbhd."""
    if qkv_format == "bshd":
        return x.view(like.shape)
    if qkv_format == "sbhd":
        return x.view(like.shape[1], like.shape[0], *like.shape[2:]).transpose(0, 1).contiguous()
    return x


@dataclass(frozen=True)
class SeqLayout:
    """Where the sequences of a batch live along the flattened token dimension.

    starts[n]: first token of sequence n; spans[n]: tokens allocated to it (a V chunk never
    crosses a span); lens[n] <= spans[n]: its real tokens (the rest is padding).
    """

    starts: Tuple[int, ...]
    spans: Tuple[int, ...]
    lens: Tuple[int, ...]

    @staticmethod
    def dense(batch: int, seqlen: int, lens: Optional[Sequence[int]] = None) -> "SeqLayout":
        """bshd/sbhd: sample b spans tokens [b*seqlen, (b+1)*seqlen) of the flattened [b*s] axis."""
        lens = tuple(int(x) for x in lens) if lens is not None else (seqlen,) * batch
        if len(lens) != batch or any(not 0 <= x <= seqlen for x in lens):
            raise ValueError(f"sequence lengths {lens} do not fit {batch} samples of {seqlen}")
        return SeqLayout(tuple(b * seqlen for b in range(batch)), (seqlen,) * batch, lens)

    @staticmethod
    def varlen(cu_seqlens, cu_seqlens_padded=None) -> "SeqLayout":
        """thd: real lengths from cu_seqlens, allocation from cu_seqlens_padded (or cu_seqlens)."""
        cu = [int(x) for x in torch.as_tensor(cu_seqlens).tolist()]
        cu_pad = cu if cu_seqlens_padded is None else [int(x) for x in cu_seqlens_padded.tolist()]
        lens = tuple(b - a for a, b in zip(cu[:-1], cu[1:]))
        spans = tuple(b - a for a, b in zip(cu_pad[:-1], cu_pad[1:]))
        if len(lens) != len(spans) or any(l > s for l, s in zip(lens, spans)):
            raise ValueError("cu_seqlens and cu_seqlens_padded disagree")
        return SeqLayout(tuple(cu_pad[:-1]), spans, lens)

    @property
    def num_seqs(self) -> int:
        return len(self.starts)

    @property
    def total(self) -> int:
        return self.starts[-1] + self.spans[-1] if self.starts else 0

    def chunk_ids(self, chunk: int) -> Tuple[torch.Tensor, List[int]]:
        """Chunk index of every token ([total] int64) and the chunk offsets per sequence.

        Chunks of `chunk` tokens start at each sequence's first token; the last chunk of a
        sequence may be short. Tokens outside every span get id -1.
        """
        ids = torch.full((self.total,), -1, dtype=torch.int64)
        cu_chunks = [0]
        for start, span in zip(self.starts, self.spans):
            local = torch.arange(span, dtype=torch.int64) // chunk
            ids[start : start + span] = cu_chunks[-1] + local
            cu_chunks.append(cu_chunks[-1] + (span + chunk - 1) // chunk)
        return ids, cu_chunks


def allowed_positions(
    mask_type: str,
    window_size: Optional[Tuple[int, int]],
    len_q: int,
    len_kv: int,
    span_q: Optional[int] = None,
    span_kv: Optional[int] = None,
) -> torch.Tensor:
    """[span_q, span_kv] bool: may row i see position j? Padding rows and columns see nothing."""
    check_mask_type(mask_type, window_size)
    span_q = len_q if span_q is None else span_q
    span_kv = len_kv if span_kv is None else span_kv
    left, right = window_size if window_size is not None else (-1, -1)
    if "causal" in mask_type:
        right = 0
    off = diagonal_offset(mask_type, len_q, len_kv)
    i = torch.arange(span_q).unsqueeze(1)
    j = torch.arange(span_kv).unsqueeze(0)
    ok = (i < len_q) & (j < len_kv)
    if right >= 0:
        ok &= j <= i + off + right
    if left >= 0:
        ok &= j >= i + off - left
    return ok


def fp8_tile_map(allowed: torch.Tensor, len_q: int) -> torch.Tensor:
    """[ceil(span_q / Q_TILE), ceil(span_kv / KV_TILE)] bool: may the pair use FP8 V?

    See Note [Mask-exact FP8 scaling] in formats.py: yes iff the KV tile is complete and every
    real row of the query tile may see every one of its positions. Query tiles with no real row
    are marked False (they produce no output that matters).
    """
    span_q, span_kv = allowed.shape
    n_qt = (span_q + Q_TILE - 1) // Q_TILE
    n_kt = (span_kv + KV_TILE - 1) // KV_TILE
    out = torch.zeros(n_qt, n_kt, dtype=torch.bool)
    for qt in range(n_qt):
        rows = allowed[qt * Q_TILE : min((qt + 1) * Q_TILE, len_q)]
        if rows.shape[0] == 0:
            continue
        for kt in range(span_kv // KV_TILE):  # complete KV tiles only
            out[qt, kt] = bool(rows[:, kt * KV_TILE : (kt + 1) * KV_TILE].all())
    return out


def sequence_masks(
    layout_q: SeqLayout,
    layout_kv: SeqLayout,
    mask_type: str,
    window_size: Optional[Tuple[int, int]],
) -> Iterator[Tuple[int, slice, slice, torch.Tensor]]:
    """Per sequence n: (n, its query rows, its key columns along the flattened token axes,
    allowed_positions over their spans [span_q, span_kv] bool)."""
    for n in range(layout_q.num_seqs):
        rows = slice(layout_q.starts[n], layout_q.starts[n] + layout_q.spans[n])
        cols = slice(layout_kv.starts[n], layout_kv.starts[n] + layout_kv.spans[n])
        allowed = allowed_positions(
            mask_type,
            window_size,
            layout_q.lens[n],
            layout_kv.lens[n],
            layout_q.spans[n],
            layout_kv.spans[n],
        )
        yield n, rows, cols, allowed
