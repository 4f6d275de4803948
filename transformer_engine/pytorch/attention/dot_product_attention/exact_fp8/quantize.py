"""Mask-exact FP8 quantization of Q, K and V: the Python API over torch tensors.

Each function validates its input, allocates the outputs and runs the CUDA kernel of the
`transformer_engine_exact_fp8` extension on torch's current stream. For CPU tensors, or when the
extension is not built, it runs the pure-torch reference of reference/quantize.py instead (on the
CPU, results moved to the input's device): the same bits, much slower. `_reference_cast` is the
one place where this module calls the reference (the oracle); nothing else of the production path
imports it. Validation is the same for
both backends. See Note [Mask-exact FP8 scaling] in formats.py for the rules and
docs/quantization_kernels.md for the kernels.

Tokens: bshd [b, s, h, d] and sbhd [s, b, h, d] flatten to t = b * s tokens in (b, s) order; thd
is [t, h, d] with cu_seqlens, the sequences' token offsets (TE's cu_seqlens_padded when the
sequences are padded). Outputs are head-major, and V's are transposed (token axis last), as the
attention kernel reads them.
"""

import functools
import warnings
from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

from .formats import MX_BLOCK, V_CHUNK_CURRENT
from .masks import QKV_FORMATS, SeqLayout, to_tokens
from .vt_layout import (
    KEY_ORDERS,
    aligned_column_starts,
    aligned_column_starts_list,
    aligned_width_bound,
    dense_column_starts,
    dense_offsets,
    key_order_columns,
)

try:
    import transformer_engine_exact_fp8 as _ext
except ImportError as _err:
    _ext = None
    _EXT_IMPORT_ERROR: Optional[ImportError] = _err
else:
    _EXT_IMPORT_ERROR = None

__all__ = [
    "QKV_FORMATS",
    "BACKENDS",
    "CURRENT_HEAD_DIMS",
    "MAX_MX_HEAD_DIM",
    "CHUNK_SIZES",
    "TOKEN_PAD",
    "chunk_bound",
    "dense_transposed_sizes",
    "extension_available",
    "sequence_offsets",
    "per_token_cast_to_fp8",
    "per_chunk_cast_to_fp8_transposed",
    "per_block_cast_to_mxfp8_rowwise",
    "per_chunk_cast_to_mxfp8_columnwise_transposed",
]

BACKENDS = ("auto", "cuda", "torch")
CURRENT_HEAD_DIMS = (64, 128, 256)
MAX_MX_HEAD_DIM = 1024
CHUNK_SIZES = (16, 32, 64, 128)
TOKEN_PAD = 16
"""The token axis of a transposed output is padded to a multiple of 16 (16-byte rows)."""

_INPUT_DTYPES = (torch.bfloat16, torch.float16)
_FP8 = torch.float8_e4m3fn


def extension_available() -> bool:
    """Whether the CUDA extension `transformer_engine_exact_fp8` is importable."""
    return _ext is not None


class _Geometry(NamedTuple):
    """An input seen as [batch, seqlen, heads, head_dim] with element strides; t = b * seqlen + s.
    (A NamedTuple: built on every cast, for a fraction of a frozen dataclass's host time.)"""

    batch: int
    seqlen: int
    heads: int
    head_dim: int
    stride_batch: int
    stride_seq: int
    stride_head: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seqlen


def _geometry(x: torch.Tensor, qkv_format: str, name: str) -> _Geometry:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if qkv_format not in QKV_FORMATS:
        raise ValueError(f"qkv_format must be one of {QKV_FORMATS}, got {qkv_format!r}")
    if x.dtype not in _INPUT_DTYPES:
        raise TypeError(f"{name} must be bfloat16 or float16, got {x.dtype}")
    ndim = 3 if qkv_format == "thd" else 4
    if x.dim() != ndim:
        raise ValueError(
            f"{name} in {qkv_format} must have {ndim} dims [{', '.join(qkv_format)}],"
            f" got shape {tuple(x.shape)}"
        )
    if x.stride(-1) != 1:
        raise ValueError(
            f"{name}'s head dim must be contiguous (stride 1), got strides {tuple(x.stride())}"
        )
    if qkv_format == "thd":
        t, h, d = x.shape
        return _Geometry(1, t, h, d, 0, x.stride(0), x.stride(1))
    if qkv_format == "bshd":
        b, s, h, d = x.shape
        return _Geometry(b, s, h, d, x.stride(0), x.stride(1), x.stride(2))
    s, b, h, d = x.shape
    return _Geometry(b, s, h, d, x.stride(1), x.stride(0), x.stride(2))


def _check_current_head_dim(head_dim: int, name: str) -> None:
    if head_dim not in CURRENT_HEAD_DIMS:
        raise ValueError(
            f"{name}: current scaling supports head dims {CURRENT_HEAD_DIMS}, got {head_dim}"
        )


def _check_mx_head_dim(head_dim: int, name: str) -> None:
    if head_dim % MX_BLOCK or not MX_BLOCK <= head_dim <= MAX_MX_HEAD_DIM:
        raise ValueError(
            f"{name}: MXFP8 needs a head dim that is a multiple of {MX_BLOCK}, at most"
            f" {MAX_MX_HEAD_DIM}, got {head_dim}"
        )


def _use_cuda(backend: str, x: torch.Tensor) -> bool:
    """Pick the backend: the CUDA kernels for CUDA tensors when built, else the reference."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torch":
        return False
    if backend == "cuda":
        if not x.is_cuda:
            raise ValueError(f"backend='cuda' needs CUDA tensors, got one on {x.device}")
        if _ext is None:
            raise RuntimeError(
                "backend='cuda': the extension transformer_engine_exact_fp8 is not built"
                f" ({_EXT_IMPORT_ERROR})"
            )
        return True
    if x.is_cuda and _ext is None:
        warnings.warn(
            "transformer_engine_exact_fp8 is not built: quantizing with the (slow, CPU) torch"
            f" reference instead ({_EXT_IMPORT_ERROR})",
            RuntimeWarning,
        )
        return False
    return x.is_cuda


def _token_view(x: torch.Tensor, geo: _Geometry):
    return _ext.TokenView(
        data=x.data_ptr(),
        dtype=_ext.BFLOAT16 if x.dtype == torch.bfloat16 else _ext.FLOAT16,
        batch=geo.batch,
        seqlen=geo.seqlen,
        heads=geo.heads,
        head_dim=geo.head_dim,
        stride_batch=geo.stride_batch,
        stride_seq=geo.stride_seq,
        stride_head=geo.stride_head,
    )


# The handle without building a torch.cuda.Stream (the call Triton's launcher makes); the public
# route where a torch build lacks it.
_get_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _raw_stream(device_index: int) -> int:
    """torch's current stream on a device, as the raw cudaStream_t handle."""
    if _get_raw_stream is not None:
        return _get_raw_stream(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def _launch(x: torch.Tensor, kernel, *args) -> None:
    """Run an extension function on x's device and torch's current stream there.

    The device is switched only when it is not current already: the context manager costs more
    host time than the kernel launch itself at small shapes."""
    device = x.get_device()
    if device == torch.cuda.current_device():
        kernel(*args, _raw_stream(device))
        return
    with torch.cuda.device(device):
        kernel(*args, _raw_stream(device))


def _cpu_tokens(x: torch.Tensor, qkv_format: str) -> torch.Tensor:
    """x as tokens [t, h, d] on the CPU, for the reference."""
    return to_tokens(x.detach().cpu(), qkv_format)


def _reference_cast(name: str, *args, **kwargs):
    """The CPU fallback: run the reference rule `name` of reference/quantize.py (the oracle).

    The only route from the quantization API into the reference; imported on first use, so the
    production path loads no oracle module while the extension runs the casts."""
    from .reference import quantize as reference

    return getattr(reference, name)(*args, **kwargs)


def _head_major(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """[t, h, ...] -> [h, t, ...], contiguous, on `device`."""
    return x.transpose(0, 1).contiguous().to(device)


def per_token_cast_to_fp8(
    x: torch.Tensor,
    *,
    qkv_format: str,
    use_power_2_scales: bool = False,
    amax_epsilon: float = 0.0,
    backend: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """E4M3 with one current scale per (token, head), amax over d: Q and K of current scaling.

    x: bshd / sbhd / thd, bf16 or fp16, d in CURRENT_HEAD_DIMS, d contiguous (any other strides).
    Returns data [h, t, d] float8_e4m3fn and scale_inv [h, t] float32 (1 / scale), so that
    x[token, head] ~ data[head, token] * scale_inv[head, token].
    See Note [Mask-exact FP8 scaling].
    """
    geo = _geometry(x, qkv_format, "x")
    _check_current_head_dim(geo.head_dim, "x")
    if _use_cuda(backend, x):
        data = torch.empty(geo.heads, geo.tokens, geo.head_dim, dtype=_FP8, device=x.device)
        scale_inv = torch.empty(geo.heads, geo.tokens, dtype=torch.float32, device=x.device)
        _launch(
            x,
            _ext.per_token_cast,
            _token_view(x, geo),
            bool(use_power_2_scales),
            float(amax_epsilon),
            data.data_ptr(),
            scale_inv.data_ptr(),
        )
        return data, scale_inv
    data, scale_inv = _reference_cast(
        "per_token_cast_to_fp8",
        _cpu_tokens(x, qkv_format),
        use_power_2_scales=use_power_2_scales,
        amax_epsilon=amax_epsilon,
    )
    return _head_major(data, x.device), _head_major(scale_inv, x.device)


def per_block_cast_to_mxfp8_rowwise(
    x: torch.Tensor, *, qkv_format: str, backend: str = "auto"
) -> Tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 along d (TE's rowwise usage): Q and K of MXFP8 scaling.

    x: bshd / sbhd / thd, bf16 or fp16, d a multiple of 32 (at most MAX_MX_HEAD_DIM).
    Returns data [h, t, d] float8_e4m3fn and scales [h, t, d // 32] uint8 (E8M0 codes, amax over
    32 consecutive channels of one token and head). See Note [Mask-exact FP8 scaling].
    """
    geo = _geometry(x, qkv_format, "x")
    _check_mx_head_dim(geo.head_dim, "x")
    if _use_cuda(backend, x):
        data = torch.empty(geo.heads, geo.tokens, geo.head_dim, dtype=_FP8, device=x.device)
        scales = torch.empty(
            geo.heads, geo.tokens, geo.head_dim // MX_BLOCK, dtype=torch.uint8, device=x.device
        )
        _launch(
            x,
            _ext.per_block_cast_mxfp8_rowwise,
            _token_view(x, geo),
            data.data_ptr(),
            scales.data_ptr(),
        )
        return data, scales
    data, scales = _reference_cast("per_block_cast_to_mxfp8_rowwise", _cpu_tokens(x, qkv_format))
    return _head_major(data, x.device), _head_major(scales, x.device)


@dataclass(frozen=True)
class _Sequences:
    """V's sequences along its token axis: chunks start at each one's first token.

    layout None (thd, sync_free): the offsets stay on the device; sizes are bounds over every
    cu_seqlens of the pack's token count (chunk_bound, aligned_width_bound).
    """

    layout: Optional[SeqLayout]
    cu_seqlens: Optional[torch.Tensor]  # [n_seqs + 1] int32 on v's device; None for bshd/sbhd

    @property
    def num_seqs(self) -> int:
        return self.cu_seqlens.numel() - 1 if self.layout is None else self.layout.num_seqs

    def cu_chunks(self, chunk: int) -> List[int]:
        """[n_seqs + 1] chunk offsets: sequence n owns chunks cu[n] .. cu[n + 1] - 1."""
        out = [0]
        for span in self.layout.spans:
            out.append(out[-1] + (span + chunk - 1) // chunk)
        return out

    def num_chunks(self, chunk: int, tokens: int) -> int:
        """Rows of the scales: the chunk count, or its bound when the offsets stay on the device."""
        if self.layout is None:
            return chunk_bound(tokens, self.num_seqs, chunk)
        return self.cu_chunks(chunk)[-1]


@functools.lru_cache(maxsize=256)
def _dense_sequences(batch: int, seqlen: int) -> _Sequences:
    """bshd/sbhd samples (no tensors: the same for every device; frozen, so shared)."""
    return _Sequences(SeqLayout.dense(batch, seqlen), None)


@functools.lru_cache(maxsize=256)
def dense_transposed_sizes(batch: int, seqlen: int, chunk: int, aligned: bool) -> Tuple[int, int]:
    """(width, num_chunks) of a bshd/sbhd V cast (per_chunk_cast_to_fp8_transposed with
    aligned_columns=aligned): the columns of data_t and the rows of the scales, computed once
    per shape instead of per call (O(batch) Python loops)."""
    seqs, geo = _dense_sequences(batch, seqlen), _Geometry(batch, seqlen, 0, 0, 0, 0, 0)
    return _output_width(seqs, geo, aligned), seqs.num_chunks(chunk, geo.tokens)


def chunk_bound(tokens: int, num_seqs: int, chunk: int) -> int:
    """The most chunks that num_seqs sequences of `tokens` tokens in all can have: sum over n of
    ceil(len_n / chunk) <= (tokens + num_seqs * (chunk - 1)) / chunk."""
    return (tokens + num_seqs * (chunk - 1)) // chunk


def _sequences(
    v: torch.Tensor,
    geo: _Geometry,
    qkv_format: str,
    cu_seqlens: Optional[torch.Tensor],
    sync_free: bool,
) -> _Sequences:
    if qkv_format != "thd":
        if cu_seqlens is not None:
            raise ValueError(
                f"cu_seqlens is for thd only: in {qkv_format} the chunks start at each sample's"
                " first token"
            )
        return _dense_sequences(geo.batch, geo.seqlen)
    if cu_seqlens is None:
        raise ValueError(
            "thd needs cu_seqlens (TE's cu_seqlens_padded when the sequences are padded)"
        )
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype != torch.int32:
        raise TypeError(
            f"cu_seqlens must be an int32 tensor, got {getattr(cu_seqlens, 'dtype', cu_seqlens)}"
        )
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            f"cu_seqlens must be 1-D with >= 2 entries, got shape {tuple(cu_seqlens.shape)}"
        )
    if cu_seqlens.device != v.device:
        raise ValueError(
            f"cu_seqlens is on {cu_seqlens.device} but v on {v.device}: both must be on one device"
        )
    if sync_free:
        return _Sequences(None, cu_seqlens.contiguous())
    offsets = cu_seqlens.tolist()
    if (
        offsets[0] != 0
        or any(b < a for a, b in zip(offsets, offsets[1:]))
        or offsets[-1] > geo.tokens
    ):
        raise ValueError(
            f"cu_seqlens must start at 0, never decrease and end at most at t = {geo.tokens},"
            f" got {offsets}"
        )
    return _Sequences(SeqLayout.varlen(offsets), cu_seqlens.contiguous())


def sequence_offsets(
    cu_seqlens: torch.Tensor, chunk: int, *, aligned_columns: bool = True, backend: str = "auto"
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """A thd pack's offsets for the V casts, on cu_seqlens' device, never read by the host.

    cu_seqlens: [n_seqs + 1] int32 (non-decreasing: not checked). Returns cu_chunks
    [n_seqs + 1] int32 (sequence n's first chunk of `chunk` tokens, as the V casts return it) and,
    with aligned_columns, columns [n_seqs + 1] int32 (its first column of the aligned layout:
    vt_layout.aligned_column_starts), else None. One kernel launch for CUDA tensors when the
    extension is built (backend "auto" or "cuda"), else small torch operations.
    """
    if chunk not in CHUNK_SIZES:
        raise ValueError(f"chunk must be one of {CHUNK_SIZES} tokens, got {chunk}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            "cu_seqlens must be a 1-D int32 tensor with >= 2 entries, got"
            f" {cu_seqlens.dtype} of shape {tuple(cu_seqlens.shape)}"
        )
    if backend == "cuda" or (backend == "auto" and cu_seqlens.is_cuda and _ext is not None):
        _use_cuda("cuda", cu_seqlens)  # the checks of backend="cuda"
        cu_seqlens = cu_seqlens.contiguous()
        cu_chunks = torch.empty_like(cu_seqlens)
        columns = torch.empty_like(cu_seqlens) if aligned_columns else None
        _launch(
            cu_seqlens, _ext.sequence_offsets, cu_seqlens.data_ptr(), cu_seqlens.numel() - 1,
            chunk, cu_chunks.data_ptr(), 0 if columns is None else columns.data_ptr(),
        )  # fmt: skip
        return cu_chunks, columns
    per_seq = (cu_seqlens[1:] - cu_seqlens[:-1] + chunk - 1) // chunk
    cu_chunks = F.pad(torch.cumsum(per_seq, 0, dtype=torch.int32), (1, 0))
    return cu_chunks, aligned_column_starts(cu_seqlens) if aligned_columns else None


def _device_offsets(seqs: _Sequences, geo: _Geometry, chunk: int, aligned: bool, offsets, device):
    """(cu_chunks, columns or None) on the device for the CUDA kernels: thd's from `offsets` when
    the caller computed them, else from sequence_offsets; bshd/sbhd take both from the per-shape
    cache (read-only)."""
    if seqs.cu_seqlens is None:
        cu_chunks = dense_offsets(geo.batch, (geo.seqlen + chunk - 1) // chunk, device)
        columns = dense_column_starts(geo.batch, geo.seqlen, device, True) if aligned else None
        return cu_chunks, columns
    if offsets is not None:
        return offsets
    return sequence_offsets(seqs.cu_seqlens, chunk, aligned_columns=aligned, backend="cuda")


def _output_width(seqs: _Sequences, geo: _Geometry, aligned: bool) -> int:
    """data_t's width: t rounded up to TOKEN_PAD (token i in column i), or with `aligned` the end
    of the aligned layout's last sequence (its bound when the offsets stay on the device)."""
    if not aligned:
        return -(-geo.tokens // TOKEN_PAD) * TOKEN_PAD
    if seqs.layout is None:
        return aligned_width_bound(geo.tokens, seqs.num_seqs)
    return _output_columns(seqs.layout, True)[-1]


def _output_columns(layout: SeqLayout, aligned: bool) -> List[int]:
    """Each sequence's first column in data_t, then the end of the last: token i in column i, or
    with `aligned` the layout of vt_layout.aligned_column_starts_list."""
    starts = list(layout.starts) + [layout.total]
    return aligned_column_starts_list(starts) if aligned else starts


def _chunked_cast_transposed(
    v,
    qkv_format,
    cu_seqlens,
    chunk,
    backend,
    current,
    aligned_columns,
    sync_free,
    offsets,
    key_order,
    **scale_kw,
):
    """Common body of the two V casts; `current` picks the current (else the MXFP8) rule."""
    if key_order not in KEY_ORDERS:
        raise ValueError(f"key_order must be one of {KEY_ORDERS}, got {key_order!r}")
    geo = _geometry(v, qkv_format, "v")
    (_check_current_head_dim if current else _check_mx_head_dim)(geo.head_dim, "v")
    if chunk not in CHUNK_SIZES:
        raise ValueError(f"chunk must be one of {CHUNK_SIZES} tokens, got {chunk}")
    seqs = _sequences(v, geo, qkv_format, cu_seqlens, sync_free)
    if seqs.cu_seqlens is None:
        width, num_chunks = dense_transposed_sizes(geo.batch, geo.seqlen, chunk, aligned_columns)
    else:
        width = _output_width(seqs, geo, aligned_columns)
        num_chunks = seqs.num_chunks(chunk, geo.tokens)
    scale_dtype = torch.float32 if current else torch.uint8
    if _use_cuda(backend, v):
        cu_chunks, device_columns = _device_offsets(
            seqs, geo, chunk, aligned_columns, offsets, v.device
        )
        data_t = torch.empty(geo.heads, geo.head_dim, width, dtype=_FP8, device=v.device)
        scales = torch.empty(
            _scale_shape(geo, num_chunks, current), dtype=scale_dtype, device=v.device
        )
        chunks = _ext.Chunks(
            cu_seqlens=0 if seqs.cu_seqlens is None else seqs.cu_seqlens.data_ptr(),
            cu_chunks=cu_chunks.data_ptr(),
            num_seqs=seqs.num_seqs,
            num_chunks=num_chunks,
            chunk=chunk,
            columns=0 if device_columns is None else device_columns.data_ptr(),
            key_order=_ext.KEYS_SM90_PV if key_order == "sm90_pv" else _ext.KEYS_NATURAL,
        )
        if current:
            kernel = _ext.per_chunk_cast_transposed
            args = (scale_kw["use_power_2_scales"], scale_kw["amax_epsilon"])
        else:
            kernel, args = _ext.per_chunk_cast_mxfp8_columnwise_transposed, ()
        view = _token_view(v, geo)
        _launch(v, kernel, view, chunks, *args, data_t.data_ptr(), width, scales.data_ptr())
        return data_t, scales, cu_chunks
    layout = seqs.layout or _sequences(v, geo, qkv_format, cu_seqlens, False).layout
    return _reference_chunked_cast(
        v,
        qkv_format,
        layout,
        geo,
        chunk,
        aligned_columns,
        width,
        num_chunks,
        current,
        key_order,
        **scale_kw,
    )


def _scale_shape(geo: _Geometry, num_chunks: int, current: bool) -> Tuple[int, ...]:
    """Current scaling: [h_kv, num_chunks] (one scale per chunk and kv-head); MXFP8:
    [h_kv, num_chunks, d] (one E8M0 code per chunk and channel)."""
    if current:
        return (geo.heads, num_chunks)
    return (geo.heads, num_chunks, geo.head_dim)


def _reference_chunked_cast(
    v, qkv_format, layout, geo, chunk, aligned, width, num_chunks, current, key_order, **scale_kw
):
    """The reference's outputs in the CUDA path's shapes (num_chunks and width: bounds or the
    exact sizes; the bound's extra scale rows are 1 for current scaling, code 127 for MXFP8)."""
    tokens = _cpu_tokens(v, qkv_format)[: layout.total]  # [total, h, d]
    if current:
        data, scales, cu_chunks = _reference_cast(
            "per_chunk_cast_to_fp8", tokens, layout, chunk=chunk, **scale_kw
        )
    else:
        data, scales, cu_chunks = _reference_cast(
            "per_chunk_cast_to_mxfp8_columnwise", tokens, layout
        )
    data_t = torch.zeros(geo.heads, geo.head_dim, width, dtype=_FP8)  # [h, d, width]
    for start, span, column in zip(layout.starts, layout.spans, _output_columns(layout, aligned)):
        tokens = start + key_order_columns(span, key_order)
        data_t[:, :, column : column + span] = data[tokens].permute(1, 2, 0)
    unit = 1.0 if current else 127  # scale_inv 1 / E8M0 code of 2^0
    pad_rows = scales.new_full((num_chunks - scales.shape[0], *scales.shape[1:]), unit)
    # [h, num_chunks] (current) or [h, num_chunks, d] (MXFP8)
    scales = torch.cat([scales, pad_rows]).transpose(0, 1).contiguous()
    return (
        data_t.to(v.device),
        scales.to(v.device),
        torch.tensor(cu_chunks, dtype=torch.int32, device=v.device),
    )


def per_chunk_cast_to_fp8_transposed(
    v: torch.Tensor,
    *,
    qkv_format: str,
    cu_seqlens: Optional[torch.Tensor] = None,
    chunk: int = V_CHUNK_CURRENT,
    use_power_2_scales: bool = False,
    amax_epsilon: float = 0.0,
    aligned_columns: bool = False,
    sync_free: bool = False,
    offsets: Optional[Tuple[torch.Tensor, Optional[torch.Tensor]]] = None,
    key_order: str = "natural",
    backend: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """E4M3 with ONE current scale per (kv-head, chunk of `chunk` tokens): V, transposed.

    v: bshd / sbhd / thd, bf16 or fp16, d in CURRENT_HEAD_DIMS, d contiguous; cu_seqlens
    ([n_seqs + 1] int32 on v's device) for thd only. chunk in CHUNK_SIZES (the format's constant
    is V_CHUNK_CURRENT). Chunks start at each sequence's first token and never cross a sequence;
    the last chunk of a sequence may be short.
    Returns data_t [h_kv, d, t_pad] float8_e4m3fn (t_pad = t rounded up to TOKEN_PAD; token i in
    column i; columns of no sequence are 0), scale_inv [h_kv, n_chunks] float32 (1 / scale,
    amax over the chunk's tokens and all d channels of the kv-head) and cu_chunks [n_seqs + 1]
    int32 (sequence n owns chunks cu_chunks[n] .. cu_chunks[n + 1] - 1; for bshd/sbhd a cached
    tensor that calls of the same shape share: read-only). See Note [Mask-exact FP8 scaling].
    aligned_columns: data_t [h_kv, d, width] instead, with sequence n's tokens from column
    vt_layout.aligned_column_starts_list(starts)[n] on (a multiple of 32: the attention
    kernel's TMA boxes need 16, whole DRAM sectors 32; width: the list's last entry) and 0 in the
    columns between sequences.
    Same bytes, other columns: this decides nothing about the quantization.
    sync_free (thd): never read cu_seqlens back to the host (no device sync; the call can be
    captured in a CUDA graph and replayed with other cu_seqlens contents). cu_seqlens is then not
    checked against t, and the sizes are bounds over every cu_seqlens of n_seqs sequences in t
    tokens: n_chunks = chunk_bound(t, n_seqs, chunk) (rows past cu_chunks[-1] unspecified: the
    CUDA kernel leaves them unwritten) and, with aligned_columns, width =
    vt_layout.aligned_width_bound(t, n_seqs) (the columns past the last sequence are 0).
    offsets (thd, CUDA kernels): what sequence_offsets(cu_seqlens, chunk,
    aligned_columns=aligned_columns) returned, for a caller that needs them too (the attention
    launcher reads the columns); used as given, not checked.
    key_order: vt_layout.KEY_ORDERS; "sm90_pv" permutes the tokens inside each complete 16-token
    group of a sequence for the sm90 CUDA kernel (vt_layout.SM90_PV_KEY_ORDER). Same bytes,
    other columns.
    """
    return _chunked_cast_transposed(
        v,
        qkv_format,
        cu_seqlens,
        chunk,
        backend,
        True,
        aligned_columns,
        sync_free,
        offsets,
        key_order,
        use_power_2_scales=bool(use_power_2_scales),
        amax_epsilon=float(amax_epsilon),
    )


def per_chunk_cast_to_mxfp8_columnwise_transposed(
    v: torch.Tensor,
    *,
    qkv_format: str,
    cu_seqlens: Optional[torch.Tensor] = None,
    aligned_columns: bool = False,
    sync_free: bool = False,
    offsets: Optional[Tuple[torch.Tensor, Optional[torch.Tensor]]] = None,
    backend: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MXFP8 along the tokens (TE's columnwise usage), one E8M0 code per 32 tokens: V, transposed.

    v: as for per_chunk_cast_to_fp8_transposed, with d a multiple of 32 (at most
    MAX_MX_HEAD_DIM). Chunks are MX blocks of 32 tokens starting at each sequence's first token.
    Returns data_t [h_kv, d, t_pad] float8_e4m3fn, scales [h_kv, n_chunks, d] uint8 (E8M0 codes,
    one per 32 tokens and channel)
    and cu_chunks [n_seqs + 1] int32 (read-only for bshd/sbhd). See Note [Mask-exact FP8
    scaling]. aligned_columns, sync_free, offsets: as for per_chunk_cast_to_fp8_transposed.
    """
    return _chunked_cast_transposed(
        v,
        qkv_format,
        cu_seqlens,
        MX_BLOCK,
        backend,
        False,
        aligned_columns,
        sync_free,
        offsets,
        "natural",
    )
