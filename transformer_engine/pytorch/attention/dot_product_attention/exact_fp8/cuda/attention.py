"""Mask-exact FP8 attention forward on the sm_90a CUDA kernel: the launcher.

    out, lse = exact_fp8_attention_forward(q, k, v, recipe="current", attn_mask_type="causal")

Same arguments and results as triton.attention.exact_fp8_attention_forward, for the subset the
kernel implements so far (docs/attention_kernel_sm90.md): bshd, sbhd or thd, bf16 or fp16,
d = 64 or 128, current scaling, every mask type of masks.py with or without a sliding window,
MHA or GQA, on an sm90 GPU. Anything else raises ValueError naming what is not supported; the
Triton backend runs it. The kernel reads and writes bshd views or thd packs: an sbhd call runs it
on the bshd views of Q, K, V and O (the casts read any strides; V's tensor map and the epilogue
take V's and O's batch and sequence strides), no copies. Padding masks and thd read each
sequence's real length and first token from cu_seqlens (sequences.py), on the device.

Q, K and V are quantized here by the fork's quantization kernels (quantize.py; rules v2 of
Note [Mask-exact FP8 scaling] in formats.py): Q8 [h, t_q, d] and K8 [h_kv, t_kv, d] per token,
V8^T [h_kv, d, t_pad] with one fp32 scale per (sample, kv-head, 128-token chunk). The kernel takes Q
quantized (a Q cast inside it measured slower: docs/attention_kernel_sm90.md, item 9). A dense
call from bf16 / fp16 inputs makes the casts (Q and K in one launch, V beside it on a second
stream) and the kernel launch in one extension call (attention_sm90_fwd_quantizing: one host
round trip, for small calls) into a workspace; a call with q_fp8, a padding mask or thd
quantizes here (quantize_operands), then launches the kernel.
"""

import functools
import inspect
import threading
from typing import NamedTuple, Optional, Tuple

import torch

from .. import quantize
from ..formats import KV_TILE, V_CHUNK_CURRENT, check_recipe
from ..kernels import device_capability
from ..masks import QKV_FORMATS, bshd_view, check_mask_type
from ..sequences import Sequences, sequences
from ..vt_layout import dense_column_starts, dense_needs_alignment, dense_offsets

__all__ = [
    "HEAD_DIMS",
    "Operands",
    "exact_fp8_attention_forward",
    "extension_has_kernel",
    "forward_supported",
    "launch",
    "quantize_operands",
    "unsupported_reason",
]

HEAD_DIMS = (64, 128)
_DTYPE_CODES = {torch.bfloat16: 0, torch.float16: 1}  # NVTEExactFP8DType
# The C API's `causal`: no causal bound (windows align bottom-right), causal top-left, causal
# bottom-right (masks.allowed_positions).
_MASK_CODES = {
    "no_mask": 0, "padding": 0, "causal": 1, "padding_causal": 1, "causal_bottom_right": 2,
    "padding_causal_bottom_right": 2,
}  # fmt: skip
_SYMBOL = "attention_sm90_fwd"


def extension_has_kernel() -> bool:
    """Whether the extension was built with the sm_90a attention kernel."""
    return quantize._ext is not None and hasattr(quantize._ext, _SYMBOL)


def _unsupported(what: str) -> ValueError:
    return ValueError(
        f"the sm90 CUDA attention kernel does not support {what} yet (it runs bshd, sbhd or thd,"
        f" bf16 or fp16, d = 64 or 128, current scaling, every mask type and window); use"
        " the Triton backend"
    )


def exact_fp8_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs):
    """Mask-exact FP8 attention forward on sm_90a. Returns (out, lse).

    Arguments: forward_supported's. Raises ValueError naming what the kernel does not run (or
    an argument error)."""
    error = _refusal(q, k, v, kwargs)
    if error is not None:
        raise error
    return forward_supported(q, k, v, **kwargs)


def unsupported_reason(q, k, v, **kwargs) -> Optional[str]:
    """Why the kernel does not run this call (forward_supported's arguments), or None: the
    checks of exact_fp8_attention_forward, which kernels.choose_backend makes once per call."""
    error = _refusal(q, k, v, kwargs)
    return None if error is None else str(error)


def forward_supported(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    recipe: str,
    qkv_format: str = "bshd",
    attn_mask_type: str = "causal",
    window_size: Optional[Tuple[int, int]] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_kv: Optional[torch.Tensor] = None,
    cu_seqlens_q_padded: Optional[torch.Tensor] = None,
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    softmax_scale: Optional[float] = None,
    use_power_2_scales: bool = False,
    amax_epsilon: float = 0.0,
    fp8_v_everywhere: bool = False,
    q_fp8: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The forward of a call unsupported_reason accepts (it checks nothing itself).

    q [b, s_q, h, d], k, v [b, s_kv, h_kv, d] (h % h_kv == 0; sbhd: [s, b, ...]; thd: [t, h, d]
    with cu_seqlens_q / cu_seqlens_kv, and cu_seqlens_*_padded for padded allocations), bf16 or
    fp16 (all three alike), d = 64 or 128; out: q's shape and dtype, contiguous; lse [h, t_q] fp32
    (t_q: b * s_q, or thd's t; natural log; -inf and out 0 for a row that sees no key and for
    padding). q_fp8: Q already quantized (data [h, t_q, d] e4m3, scale_inv [h, t_q] fp32).
    cu_seqlens_q / cu_seqlens_kv: the real lengths of bshd / sbhd samples under a padding mask
    ([b + 1] int32; all of them when None), of thd's sequences. max_seqlen_q (thd): the longest
    real query sequence or more, read on the host otherwise (a sync; required under CUDA graph
    capture). max_seqlen_kv is taken for the common signature.
    fp8_v_everywhere=True is the LEAKY lower bound of the Triton kernel's signature, for
    benchmarks and negative controls only: boundary tiles keep their element-wise mask but use
    E4M3 P and V8^T with its chunk scale, so hidden keys of a boundary tile change visible rows
    (dense samples without a padding mask or window, s_kv a multiple of 128).
    """
    del recipe, max_seqlen_kv
    mask = _Mask(_MASK_CODES[attn_mask_type], *(window_size or (-1, -1)))
    args = (mask, softmax_scale, use_power_2_scales, amax_epsilon, fp8_v_everywhere, q_fp8)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)  # in q's format
    # the kernel's views (module doc): thd packs as they are, dense tensors as bshd
    views = [x if qkv_format == "thd" else bshd_view(x, qkv_format) for x in (q, k, v, out)]
    if qkv_format == "thd" or "padding" in attn_mask_type:
        seqs = sequences(
            q, k, qkv_format, attn_mask_type, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
            cu_seqlens_kv_padded, max_seqlen_q,
        )  # fmt: skip
        return out, _forward_sequences(*views, seqs, *args)
    return out, _forward_bshd(*views, *args)


class _Mask(NamedTuple):
    """The C API's mask arguments: causal (0 none, 1 top-left, 2 bottom-right) and TE's sliding
    window sides (-1: unbounded; the causal codes bound the right side at 0)."""

    causal: int
    window_left: int
    window_right: int


def _forward_bshd(q, k, v, out, mask, softmax_scale, use_power_2_scales, amax_epsilon,
                  fp8_v_everywhere, q_fp8):  # fmt: skip
    """forward_supported on dense bshd q, k, v [b, s, h, d] (views of any strides, d contiguous)
    into out (a bshd view, heads d apart, d contiguous). Returns lse."""
    batch, s_q, heads, d = q.shape
    s_kv = k.shape[1]
    if softmax_scale is None:
        softmax_scale = d**-0.5
    lse = torch.empty(heads, batch * s_q, dtype=torch.float32, device=q.device)
    if batch * s_q == 0:
        return lse
    if s_kv == 0:  # no key anywhere: every row sees nothing
        out.zero_()
        return lse.fill_(float("-inf"))
    if q_fp8 is None:  # the casts and the kernel in one extension call
        _quantize_and_launch(q, k, v, out, lse, mask, softmax_scale, use_power_2_scales,
                             amax_epsilon, fp8_v_everywhere)  # fmt: skip
        return lse
    cast = dict(qkv_format="bshd", use_power_2_scales=use_power_2_scales, amax_epsilon=amax_epsilon)
    operands = quantize_operands(q, k, v, q_fp8, **cast)
    launch(operands, out, lse, mask.causal, softmax_scale, fp8_v_everywhere, window=mask[1:])
    return lse


def _forward_sequences(q, k, v, out, seqs: Sequences, mask, softmax_scale, use_power_2_scales,
                       amax_epsilon, fp8_v_everywhere, q_fp8):  # fmt: skip
    """forward_supported under a padding mask (bshd views, as _forward_bshd takes them) or on thd
    packs q [t_q, h, d], k, v [t_kv, h_kv, d], out [t_q, h, d]: the casts, then the kernel with
    the sequences' lengths and first tokens. Returns lse."""
    del fp8_v_everywhere  # refused with sequences (_refusal)
    heads, d = q.shape[-2], q.shape[-1]
    t_q = q.shape[0] if seqs.varlen else q.shape[0] * q.shape[1]
    t_kv = k.shape[0] if seqs.varlen else k.shape[0] * k.shape[1]
    if softmax_scale is None:
        softmax_scale = d**-0.5
    lse = torch.empty(heads, t_q, dtype=torch.float32, device=q.device)
    if t_q == 0:
        return lse
    if t_kv == 0 or seqs.num_seqs == 0 or seqs.span_q == 0:  # no row sees a key
        out.zero_()
        return lse.fill_(float("-inf"))
    cast = dict(
        qkv_format="thd" if seqs.varlen else "bshd", use_power_2_scales=use_power_2_scales,
        amax_epsilon=amax_epsilon,
    )  # fmt: skip
    operands = quantize_operands(q, k, v, q_fp8, seqs=seqs, **cast)
    launch(operands, out, lse, mask.causal, softmax_scale, window=mask[1:], seqs=seqs)
    return lse


def kernel_view(x: torch.Tensor) -> torch.Tensor:
    """x [b, s, h, d] (or a thd pack [t, h, d]) as the kernel reads V and writes O: itself if its
    heads are d apart, d is contiguous and its batch and sequence strides are multiples of 8
    elements (16 bytes: TMA), else a contiguous copy (a bshd tensor, the bshd view of an sbhd
    one, a contiguous thd pack pass as they are)."""
    st = x.stride()
    if st[-1] == 1 and st[-2] == x.shape[-1] and all(s % 8 == 0 for s in st[:-2]):
        return x
    return x.contiguous()


def _strides(v: torch.Tensor, out: torch.Tensor) -> Tuple[int, int, int, int, int]:
    """The kernel's v and out arguments: their batch and sequence strides (elements; a thd
    pack's batch stride is 0, not read) and the dtype's code (NVTEExactFP8DType)."""
    if v.dim() == 3:
        return 0, v.stride(0), 0, out.stride(0), _DTYPE_CODES[v.dtype]
    return v.stride(0), v.stride(1), out.stride(0), out.stride(1), _DTYPE_CODES[v.dtype]


def _sequence_args(seqs: Optional[Sequences], t_q: int, t_kv: int) -> tuple:
    """The kernel's sequence arguments: cu_seqlens_q, cu_seqlens_kv, seq_starts_q, seq_starts_kv
    (device pointers, 0: none) and tokens_q, tokens_kv (thd's pack sizes, 0: dense)."""
    if seqs is None:
        return 0, 0, 0, 0, 0, 0
    cu = seqs.cu_q.data_ptr(), seqs.cu_kv.data_ptr()
    if not seqs.varlen:
        return (*cu, 0, 0, 0, 0)
    return (*cu, seqs.cu_q_start.data_ptr(), seqs.cu_kv_start.data_ptr(), t_q, t_kv)


class _Workspace(NamedTuple):
    """Where _quantize_and_launch's casts write the operands of quantize_operands: byte offsets
    into one uint8 buffer of `nbytes` (each 16-byte aligned for TMA and the casts' stores), and
    the V8^T layout's sizes. One per shape (_workspace)."""

    nbytes: int
    q8: int  # [h, t_q, d] e4m3
    q_scale: int  # [h, t_q] fp32
    k8: int  # [h_kv, t_kv, d] e4m3
    k_scale: int  # [h_kv, t_kv] fp32
    v8t: int  # [h_kv, d, vt_width] e4m3, key order SM90_PV_KEY_ORDER
    v_scale: int  # [h_kv, num_chunks] fp32
    vt_width: int
    num_chunks: int
    aligned: bool  # V8^T in the aligned layout (batch > 1, s_kv % 16 != 0: vt_layout)


_WORKSPACE_ALIGN = 256


@functools.lru_cache(maxsize=256)
def _workspace(batch, s_q, s_kv, heads, heads_kv, d) -> _Workspace:
    aligned = dense_needs_alignment(batch, s_kv)
    width, num_chunks = quantize.dense_transposed_sizes(batch, s_kv, V_CHUNK_CURRENT, aligned)
    t_q, t_kv = batch * s_q, batch * s_kv
    sizes = (heads * t_q * d, heads * t_q * 4, heads_kv * t_kv * d, heads_kv * t_kv * 4,
             heads_kv * d * width, heads_kv * num_chunks * 4)  # fmt: skip
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end += -(-size // _WORKSPACE_ALIGN) * _WORKSPACE_ALIGN
    return _Workspace(end, *offsets, width, num_chunks, aligned)


def _dense_v_offsets(batch, s_kv, device, aligned, capturing):
    """(cu_chunks, cu_vt), [b + 1] int32 each, of a dense V8^T: vt_layout's per-shape cached
    tensors (read-only), looked up together; fresh ones while a CUDA graph is being captured
    (vt_layout.dense_offsets says why)."""
    if capturing:
        return _v_offsets(batch, s_kv, device, aligned)
    return _cached_v_offsets(batch, s_kv, device, aligned)


def _v_offsets(batch, s_kv, device, aligned):
    cu_chunks = dense_offsets(batch, -(-s_kv // V_CHUNK_CURRENT), device)
    return cu_chunks, dense_column_starts(batch, s_kv, device, aligned)


_cached_v_offsets = functools.lru_cache(maxsize=64)(_v_offsets)


# A call whose operands take at most this many bytes (b * s * h * d up to about 2^21 at d = 128)
# quantizes into a buffer kept for its (device, stream, host thread) instead of a fresh one.
SMALL_WORKSPACE_BYTES = 8 << 20
_small_buffers = {}  # (device index, raw stream, thread id) -> uint8 buffer, grown as needed


def _workspace_buffer(nbytes: int, device: torch.device, capturing: bool) -> torch.Tensor:
    """The uint8 buffer of one call's operands. A small call reuses its stream's buffer: the
    previous call on that stream has read it before this call's casts write it (stream order),
    and one host thread's launches never interleave with another's between the casts and the
    kernel. Fresh (the stream-ordered allocator frees it once the kernels are done) for a large
    call and while a CUDA graph is being captured (the graph's pool owns its buffers)."""
    if capturing or nbytes > SMALL_WORKSPACE_BYTES:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, quantize._raw_stream(index), threading.get_ident())
    buffer = _small_buffers.get(key)
    if buffer is None or buffer.numel() < nbytes:
        buffer = _small_buffers[key] = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return buffer


def _quantize_and_launch(q, k, v, out, lse, mask, softmax_scale, pow2, epsilon, leaky):
    """quantize_operands and launch in one extension call (attention_sm90_fwd_quantizing: the Q
    and K casts in one launch, the V cast beside it, the kernel), the operands in a workspace
    (_workspace_buffer). For the host time of small calls: same bytes."""
    batch, s_q, heads, d = q.shape
    s_kv, heads_kv = k.shape[1], k.shape[2]
    ws = _workspace(batch, s_q, s_kv, heads, heads_kv, d)
    capturing = torch.cuda.is_current_stream_capturing()
    # Held until the launches are enqueued: freed earlier, its memory could go to the offsets
    # below (a fresh buffer under capture or for a large call).
    buffer = _workspace_buffer(ws.nbytes, q.device, capturing)
    base = buffer.data_ptr()
    cu_chunks, cu_vt = _dense_v_offsets(batch, s_kv, q.device, ws.aligned, capturing)
    qs, ks = q.stride(), k.stride()
    if qs[3] != 1:  # the casts' views take d contiguous (any other strides)
        q = q.contiguous()
        qs = q.stride()
    if ks[3] != 1:
        k = k.contiguous()
        ks = k.stride()
    v = kernel_view(v)
    quantize._launch(
        out, quantize._ext.attention_sm90_fwd_quantizing,
        q.data_ptr(), qs[0], qs[1], qs[2], k.data_ptr(), ks[0], ks[1], ks[2],
        bool(pow2), float(epsilon), base + ws.q8, base + ws.q_scale, base + ws.k8,
        base + ws.k_scale, base + ws.v8t, base + ws.v_scale, cu_chunks.data_ptr(),
        cu_vt.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
        batch, s_q, s_kv, heads, heads_kv, d, ws.vt_width, ws.num_chunks,
        mask.causal, float(softmax_scale), bool(leaky), *_strides(v, out), mask.window_left,
        mask.window_right,
    )  # fmt: skip


_PARAMETERS = frozenset(inspect.signature(forward_supported).parameters)


def _refusal(q, k, v, kwargs) -> Optional[ValueError]:
    """The ValueError exact_fp8_attention_forward raises for this call, or None. (Written for
    host time: every call of the CUDA backend makes these checks.)"""
    if not _PARAMETERS.issuperset(kwargs):
        unknown = sorted(n for n, x in kwargs.items() if n not in _PARAMETERS and x is not None)
        if unknown:
            return ValueError(
                f"the sm90 CUDA attention kernel takes no argument(s) {', '.join(unknown)}"
            )
    if "recipe" not in kwargs:
        return ValueError("recipe is required")
    get = kwargs.get
    if get("fp8_v_everywhere"):  # the leaky variant runs dense samples without a window
        window = get("window_size")
        if get("qkv_format") == "thd" or "padding" in get("attn_mask_type", "causal"):
            return _unsupported("fp8_v_everywhere (the leaky variant) with thd or a padding mask")
        causal = "causal" in get("attn_mask_type", "causal")
        if window is not None and tuple(window) not in ((-1, -1), (-1, 0) if causal else (-1, -1)):
            return _unsupported("fp8_v_everywhere (the leaky variant) with a sliding window")
    if get("qkv_format") == "thd" and (get("cu_seqlens_q") is None or get("cu_seqlens_kv") is None):
        return ValueError("thd needs cu_seqlens_q and cu_seqlens_kv")
    s_kv_dim = 0 if get("qkv_format") == "sbhd" else 1
    if get("fp8_v_everywhere") and k.dim() == 4 and k.shape[s_kv_dim] % KV_TILE != 0:
        # its V8^T keeps a ragged last 16-key group in natural order (vt_layout)
        return _unsupported("fp8_v_everywhere (the leaky variant) with s_kv not a multiple of 128")
    if get("fp8_v_everywhere") and q.dtype != torch.bfloat16:
        return _unsupported(f"fp8_v_everywhere (the leaky variant) in {q.dtype} (bf16 only)")
    if get("fp8_v_everywhere") and q.shape[-1] != 128:
        return _unsupported(f"fp8_v_everywhere (the leaky variant) at d = {q.shape[-1]} (128 only)")
    try:
        _check(q, k, v, kwargs["recipe"], get("qkv_format", "bshd"),
               get("attn_mask_type", "causal"), get("window_size"))  # fmt: skip
    except ValueError as err:
        return err
    return None


class Operands(NamedTuple):
    """What the kernel reads (rules v2 of Note [Mask-exact FP8 scaling]; t_q = b * s_q, or a thd
    pack's tokens; n: sample or sequence). A NamedTuple (immutable, built on every call for less
    host time than a frozen dataclass)."""

    q8: torch.Tensor  # [h, t_q, d] e4m3
    q_scale: torch.Tensor  # [h, t_q] fp32, scale_inv of one (token, head) of Q
    k8: torch.Tensor  # [h_kv, t_kv, d] e4m3
    k_scale: torch.Tensor  # [h_kv, t_kv] fp32, scale_inv of one (token, kv-head) of K
    v8t: torch.Tensor  # [h_kv, d, width] e4m3, V transposed (sample n from column cu_vt[n])
    v_scale: torch.Tensor  # [h_kv, num_chunks] fp32, scale_inv of one 128-token V chunk
    cu_chunks: torch.Tensor  # [b + 1] int32, sample n's first V chunk
    cu_vt: torch.Tensor  # [b + 1] int32, V8^T column of sample n's first key
    v: torch.Tensor  # [b, s_kv, h_kv, d] or [t_kv, h_kv, d] bf16 / fp16 (kernel_view): the
    # boundary tiles' V


def quantize_operands(q, k, v, q_fp8=None, *, seqs: Optional[Sequences] = None, **cast):
    """Q, K and V through the fork's quantizers into the kernel's layouts (bshd inputs, or thd
    packs with their Sequences: V's chunks start at each sequence's first token). Returns
    Operands."""
    q8, q_scale = _query_fp8(q, q_fp8, cast)
    k8, k_scale = quantize.per_token_cast_to_fp8(k, **cast)
    # The kernel's P fragment holds its keys in SM90_PV_KEY_ORDER (softmax.h, p_to_fp8_operand).
    if seqs is not None and seqs.varlen:  # the aligned layout, its offsets read on the device
        offsets = quantize.sequence_offsets(seqs.cu_kv_start, V_CHUNK_CURRENT)
        v8t, v_scale, cu_chunks = quantize.per_chunk_cast_to_fp8_transposed(
            v, chunk=V_CHUNK_CURRENT, cu_seqlens=seqs.cu_kv_start, aligned_columns=True,
            sync_free=True, offsets=offsets, key_order="sm90_pv", **cast,
        )  # fmt: skip
        cu_vt = offsets[1]
    else:
        batch, s_kv = k.shape[0], k.shape[1]
        aligned = dense_needs_alignment(batch, s_kv)
        v8t, v_scale, cu_chunks = quantize.per_chunk_cast_to_fp8_transposed(
            v, chunk=V_CHUNK_CURRENT, aligned_columns=aligned, key_order="sm90_pv", **cast
        )
        cu_vt = dense_column_starts(batch, s_kv, v.device, aligned)
    return Operands(q8, q_scale, k8, k_scale.contiguous(), v8t, v_scale.contiguous(), cu_chunks,
                    cu_vt, kernel_view(v))  # fmt: skip


def launch(
    ops: Operands,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: int,
    softmax_scale,
    fp8_v_everywhere: bool = False,
    *,
    window: Tuple[int, int] = (-1, -1),
    seqs: Optional[Sequences] = None,
):
    """Run the kernel on quantized operands into out [b, s_q, h, d] (a bshd view with
    kernel_view's strides) or [t_q, h, d] (thd) in v's dtype and lse [h, t_q]. causal: 0 no
    causal bound, 1 causal (top-left; True), 2 causal bottom-right; window: TE's window_size
    (-1: an unbounded side); seqs: the Sequences of a padding mask or thd (None: dense samples,
    every token real).
    fp8_v_everywhere: the LEAKY variant (benchmarks and negative controls only)."""
    heads, d = out.shape[-2], out.shape[-1]
    heads_kv = ops.v.shape[-2]
    if seqs is not None and seqs.varlen:  # thd: the grid's rows per sequence, the packs' sizes
        batch, s_q, s_kv = seqs.num_seqs, seqs.span_q, 0
    else:
        batch, s_q, s_kv = out.shape[0], out.shape[1], ops.v.shape[1]
    t_q, t_kv = ops.q_scale.shape[-1], ops.k_scale.shape[-1]
    # On out's device and torch's current stream there (the raw handle: no torch.cuda.Stream
    # object built per call), as the quantization kernels launch.
    quantize._launch(
        out, quantize._ext.attention_sm90_fwd,
        ops.q8.data_ptr(), ops.q_scale.data_ptr(), ops.k8.data_ptr(), ops.k_scale.data_ptr(),
        ops.v8t.data_ptr(), ops.v_scale.data_ptr(), ops.cu_chunks.data_ptr(),
        ops.cu_vt.data_ptr(), ops.v.data_ptr(), out.data_ptr(), lse.data_ptr(),
        batch, s_q, s_kv, heads, heads_kv, d, ops.v8t.shape[-1], ops.v_scale.shape[-1],
        int(causal), float(softmax_scale), bool(fp8_v_everywhere), *_strides(ops.v, out),
        *_sequence_args(seqs, t_q, t_kv), int(window[0]), int(window[1]),
    )  # fmt: skip


def _query_fp8(q, q_fp8, cast):
    if q_fp8 is None:
        return quantize.per_token_cast_to_fp8(q, **cast)
    data, scale = (x.contiguous() for x in q_fp8)
    t_q = q.shape[0] if q.dim() == 3 else q.shape[0] * q.shape[1]
    if data.dtype != torch.float8_e4m3fn or tuple(data.shape) != (q.shape[2], t_q, q.shape[3]):
        raise ValueError(f"q_fp8 data must be e4m3 [h, t_q, d] matching q, got {data.shape}")
    if scale.dtype != torch.float32 or tuple(scale.shape) != (q.shape[2], t_q):
        raise ValueError(f"q_fp8 scale_inv must be fp32 [h, t_q], got {scale.shape}")
    return data, scale


def _check(q, k, v, recipe, qkv_format, attn_mask_type, window_size):
    check_recipe(recipe)
    if qkv_format not in QKV_FORMATS:
        raise ValueError(f"qkv_format must be one of {QKV_FORMATS}, got {qkv_format!r}")
    check_mask_type(attn_mask_type, window_size)
    if recipe != "current":
        raise _unsupported(f"recipe {recipe!r}")
    ndim = 3 if qkv_format == "thd" else 4
    if q.dim() != ndim or k.dim() != ndim or v.dim() != ndim:
        raise ValueError(
            f"{qkv_format} needs {ndim}-d q, k, v; got {q.dim()}, {k.dim()}, {v.dim()}"
        )
    if ndim == 4:
        q, k, v = (bshd_view(x, qkv_format) for x in (q, k, v))  # the checks below read bshd
    if q.dtype not in _DTYPE_CODES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise _unsupported(f"dtypes {q.dtype, k.dtype, v.dtype} (bf16 or fp16, all three alike)")
    d = q.shape[-1]
    if d not in HEAD_DIMS or k.shape[-1] != d:
        raise _unsupported(f"head dim {d}")
    if k.shape != v.shape or q.shape[-2] % k.shape[-2] or (ndim == 4 and q.shape[0] != k.shape[0]):
        raise ValueError(f"k, v must match and h_kv must divide h: {q.shape}, {k.shape}, {v.shape}")
    if not q.is_cuda or device_capability(q.device) != (9, 0):
        raise ValueError("the sm90 CUDA attention kernel runs on CUDA tensors of an sm90 GPU")
    if not extension_has_kernel():
        raise ValueError(
            "transformer_engine_exact_fp8 was built without the sm_90a attention kernel"
            " (build with an sm_90 architecture: docs/building.md)"
        )
