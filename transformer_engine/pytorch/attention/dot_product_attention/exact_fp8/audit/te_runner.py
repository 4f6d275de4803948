"""The causality audit's GPU mode: every path runs through TE's own DotProductAttention.

Each path is a recipe under `transformer_engine.pytorch.autocast` (see DESIGN section 7 for the
setup): eval mode, `torch.no_grad()`, NVTE_ALLOW_NONDETERMINISTIC_ALGO=0, a fresh module for
every call (so DelayedScaling starts each call from the same scale state).

  bf16              autocast disabled
  upstream-current  Float8CurrentScaling(fp8_dpa=True, fp8_dpa_mask_exact=False)
  upstream-mxfp8    MXFP8BlockScaling(fp8_dpa=True, fp8_dpa_mask_exact=False); compute capability
                    >= 10.0 only (upstream has no MXFP8 attention below it)
  upstream-delayed  DelayedScaling(fp8_dpa=True): scales from earlier calls, fused on sm90
  fork-current      Float8CurrentScaling(fp8_dpa=True, fp8_dpa_mask_exact=True)
  fork-mxfp8        MXFP8BlockScaling(fp8_dpa=True, fp8_dpa_mask_exact=True)

`fp8_dpa_mask_exact` exists only in the fork's patched recipes: against an unpatched TE it is not
passed, and the fork paths are reported as not runnable.

upstream-current has no fused backend below sm100; there it runs upstream's unfused FP8
emulation. NVTE_UnfusedDPA_Emulate_FP8 is read on every call (DotProductAttention.forward and
dpa_utils.get_attention_backend), not at import, and TE caches its backend choice per
AttentionParams, which include the recipe, so setting the variable around this path's calls only
is enough. TE still prefers a fused backend where one exists; the row's backend column reports
what TE selected.

Nothing here imports TE at module import time: the argument conversion and the path plans are
plain functions that the CPU tests check.
"""

import contextlib
import logging
import os
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

from ..te import status
from ..te.recipe import MASK_EXACT_FIELD, MXFP8_NATIVE_CAPABILITY, attention_fp8_autocast_recipe

__all__ = [
    "TE_PATHS",
    "MASK_EXACT_FIELD",
    "NotRunnable",
    "TePathPlan",
    "plan_te_path",
    "dpa_arguments",
    "te_import_error",
    "te_environment",
    "te_runner",
    "fork_backend",
]

TE_PATHS = (
    "bf16",
    "upstream-current",
    "upstream-mxfp8",
    "upstream-delayed",
    "fork-current",
    "fork-mxfp8",
)
EMULATE_ENV = "NVTE_UnfusedDPA_Emulate_FP8"
DETERMINISM_ENV = "NVTE_ALLOW_NONDETERMINISTIC_ALGO"
_SCENARIO_KWARGS = {
    "qkv_format",
    "attn_mask_type",
    "window_size",
    "seqlens_q",
    "seqlens_kv",
    "cu_seqlens_q",
    "cu_seqlens_kv",
    "softmax_scale",
}


class NotRunnable(Exception):
    """This path cannot run here; the message says why. Such a row is neither exact nor leaky."""


@dataclass(frozen=True)
class TePathPlan:
    """How one audit path runs through TE (pure data: decided without importing TE)."""

    path: str
    recipe: Optional[str]  # class name in transformer_engine.common.recipe; None: autocast off
    mask_exact: Optional[bool]  # value passed as fp8_dpa_mask_exact; None: not passed
    emulate_fp8: bool  # set NVTE_UnfusedDPA_Emulate_FP8=1 around this path's calls
    not_runnable: str = ""  # the reason, when the path cannot run here


def plan_te_path(path: str, capability: Tuple[int, int], has_mask_exact_field: bool) -> TePathPlan:
    """The recipe of `path` on a GPU of `capability`, for a TE with or without the fork's field."""
    if path not in TE_PATHS:
        raise ValueError(f"path must be one of {TE_PATHS}, got {path!r}")
    if path == "bf16":
        return TePathPlan(path, None, None, False)
    if path == "upstream-delayed":
        return TePathPlan(path, "DelayedScaling", None, False)
    recipe = "MXFP8BlockScaling" if path.endswith("mxfp8") else "Float8CurrentScaling"
    fork = path.startswith("fork-")
    reason = ""
    if fork and not has_mask_exact_field:
        reason = (
            f"this transformer_engine has no {recipe}.{MASK_EXACT_FIELD}: it is upstream TE,"
            " not the fork"
        )
    elif path == "upstream-mxfp8" and tuple(capability) < MXFP8_NATIVE_CAPABILITY:
        reason = (
            "upstream MXFP8 attention needs compute capability >= 10.0,"
            f" this GPU is sm{capability[0]}{capability[1]}"
        )
    mask_exact = fork if has_mask_exact_field else None
    return TePathPlan(path, recipe, mask_exact, path == "upstream-current", reason)


def _padding_mask(lens, seqlen: int) -> torch.Tensor:
    """[b, 1, 1, s] bool, True where a position is padding (TE's convention: True = masked out)."""
    positions = torch.arange(seqlen).view(1, seqlen)
    return (positions >= torch.tensor(list(lens)).view(-1, 1)).view(len(lens), 1, 1, seqlen)


def dpa_arguments(kw: Dict, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Tuple[Dict, Dict]:
    """(DotProductAttention constructor kwargs, forward kwargs other than q, k, v) for a scenario's
    reference_attention kwargs. Tensors in the forward kwargs are on the CPU.

    Padded bshd/sbhd samples (seqlens_q/kv) become TE's `attention_mask`: one [b, 1, 1, s] tensor
    for self-attention, a (q, kv) pair with attention_type="cross" otherwise. thd's cu_seqlens are
    passed as int32 with their maximum lengths.
    """
    unknown = set(kw) - _SCENARIO_KWARGS
    if unknown:
        raise ValueError(f"no DotProductAttention equivalent for {sorted(unknown)}")
    fmt = kw.get("qkv_format", "bshd")
    init = dict(
        num_attention_heads=q.shape[-2],
        kv_channels=(q.shape[-1], v.shape[-1]),
        num_gqa_groups=k.shape[-2],
        attention_dropout=0.0,
        qkv_format=fmt,
        attn_mask_type=kw.get("attn_mask_type", "causal"),
        window_size=kw.get("window_size"),
        softmax_scale=kw.get("softmax_scale"),
    )
    forward = {}
    if fmt == "thd":
        for side in ("q", "kv"):
            cu = torch.as_tensor(kw[f"cu_seqlens_{side}"]).to(torch.int32)
            forward[f"cu_seqlens_{side}"] = cu
            forward[f"max_seqlen_{side}"] = int((cu[1:] - cu[:-1]).max())
    elif kw.get("seqlens_q") is not None or kw.get("seqlens_kv") is not None:
        s_dim = 1 if fmt == "bshd" else 0
        b_dim = 1 - s_dim
        lens_q = list(kw.get("seqlens_q") or [q.shape[s_dim]] * q.shape[b_dim])
        lens_kv = list(kw.get("seqlens_kv") or [k.shape[s_dim]] * k.shape[b_dim])
        mask_q = _padding_mask(lens_q, q.shape[s_dim])  # [b, 1, 1, s_q], True = padding
        mask_kv = _padding_mask(lens_kv, k.shape[s_dim])  # [b, 1, 1, s_kv]
        if lens_q == lens_kv and q.shape[s_dim] == k.shape[s_dim]:
            forward["attention_mask"] = mask_q
        else:
            init["attention_type"] = "cross"
            forward["attention_mask"] = (mask_q, mask_kv)
    return init, forward


def te_import_error() -> Optional[str]:
    """None if TE's PyTorch modules import; else the reason."""
    try:
        import transformer_engine.pytorch as te
    except Exception as err:  # TE raises more than ImportError when its libraries are missing
        return f"transformer_engine.pytorch does not import ({type(err).__name__}: {err})"
    if not hasattr(te, "DotProductAttention"):
        return "transformer_engine.pytorch has no DotProductAttention (only this repo's tree)"
    return None


def _has_mask_exact_field() -> bool:
    from transformer_engine.common import recipe

    return MASK_EXACT_FIELD in getattr(recipe.Float8CurrentScaling, "__dataclass_fields__", {})


def te_environment() -> List[str]:
    """Header lines: GPU, library versions, and whether this TE is the fork."""
    import transformer_engine
    import transformer_engine.pytorch as te

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    major, minor = torch.cuda.get_device_capability()
    cudnn = ".".join(str(x) for x in te.get_cudnn_version())
    fork = "fork (fp8_dpa_mask_exact present)" if _has_mask_exact_field() else "upstream (no field)"
    lines = [
        f"gpu={torch.cuda.get_device_name()} (sm{major}{minor})  cuda={torch.version.cuda}",
        f"transformer_engine={transformer_engine.__version__} {fork}  cudnn={cudnn}"
        f"  triton={triton_version}",
        f"through DotProductAttention, eval, no_grad, {DETERMINISM_ENV}=0",
    ]
    note = older_cudnn_note(tuple(te.get_cudnn_version()), torch.backends.cudnn.version())
    return lines + ([note] if note else [])


def older_cudnn_note(te_cudnn: Tuple[int, ...], torch_cudnn: Optional[int]) -> Optional[str]:
    """A header line when TE loaded an older cuDNN than PyTorch's (torch's version as
    torch.backends.cudnn.version() encodes it, 91900 for 9.19.0): upstream TE takes the system's
    copy first, and an older one can disable its FusedAttention (docs/building.md)."""
    if not torch_cudnn:
        return None
    torch_tuple = (torch_cudnn // 10000, torch_cudnn // 100 % 100, torch_cudnn % 100)
    if tuple(te_cudnn[:3]) >= torch_tuple:
        return None
    have = ".".join(map(str, te_cudnn[:3]))
    want = ".".join(map(str, torch_tuple))
    return (
        f"note: TE loaded cuDNN {have}, older than PyTorch's {want}: TE's BF16 attention may run"
        " unfused; set CUDNN_HOME to PyTorch's cuDNN (docs/building.md)"
    )


def _recipe_context(plan: TePathPlan):
    """A context manager yielding the autocast recipe of `plan` (None: autocast off).

    Current scaling and MXFP8 go through te_recipe.attention_fp8_autocast_recipe, which gets MXFP8
    attention on GPUs whose autocast refuses MXFP8BlockScaling (below sm100).
    """
    if plan.recipe is None:
        return contextlib.nullcontext(None)
    if plan.recipe == "DelayedScaling":
        from transformer_engine.common import recipe

        return contextlib.nullcontext(recipe.DelayedScaling(fp8_dpa=True, fp8_mha=False))
    fields = {} if plan.mask_exact is None else {MASK_EXACT_FIELD: plan.mask_exact}
    kind = "mxfp8" if plan.recipe == "MXFP8BlockScaling" else "current"
    return attention_fp8_autocast_recipe(kind, **fields)


@contextlib.contextmanager
def _env(name: str, value: Optional[str]):
    """Set (value) or leave alone (None) an environment variable for the block."""
    if value is None:
        yield
        return
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


class _Messages(logging.Handler):
    """Collects the warnings TE logs or warns during one call (a fallback's reason, say)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: List[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage().splitlines()[0])


@contextlib.contextmanager
def _collect_messages():
    handler = _Messages()
    root = logging.getLogger()
    root.addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield handler.lines
        finally:
            root.removeHandler(handler)
            handler.lines += [str(w.message).splitlines()[0] for w in caught]


def _selected_backend() -> str:
    """What TE's backend selection last chose (its module-level record of the choice)."""
    from transformer_engine.pytorch.attention.dot_product_attention import _attention_backends

    sel = _attention_backends
    if sel.get("use_flash_attention"):
        return f"FlashAttention ({sel.get('flash_attention_backend')})"
    if sel.get("use_fused_attention"):
        return f"FusedAttention (sub-backend {int(sel.get('fused_attention_backend'))})"
    if sel.get("use_unfused_attention"):
        return "UnfusedDotProductAttention"
    return "no backend"


def _to_cuda(value):
    if isinstance(value, dict):
        return {key: _to_cuda(val) for key, val in value.items()}
    if isinstance(value, tuple):
        return tuple(_to_cuda(x) for x in value)
    return value.cuda() if torch.is_tensor(value) else value


def _call_dpa(plan: TePathPlan, q, k, v, kw) -> torch.Tensor:
    """One forward through a fresh DotProductAttention; the output in q's layout, on the CPU."""
    import transformer_engine.pytorch as te

    init, forward = dpa_arguments(kw, q, k, v)
    dpa = te.DotProductAttention(**init).cuda().eval()
    with _recipe_context(plan) as recipe, torch.no_grad(), te.autocast(
        enabled=recipe is not None, recipe=recipe
    ):
        out = dpa(q.cuda(), k.cuda(), v.cuda(), **_to_cuda(forward))
    return out.reshape(q.shape[:-1] + (v.shape[-1],)).cpu()  # TE returns [..., h * d]


def _upstream_backend(plan: TePathPlan) -> str:
    """TE's own backend selection for the call that just ran."""
    name = _selected_backend()
    if plan.emulate_fp8 and name == "UnfusedDotProductAttention":
        name += f" (FP8 emulation, {EMULATE_ENV}=1)"
    return f"TE {name}"


def fork_backend(ran: "status.MaskExactStatus", out: torch.Tensor, bf16_out: torch.Tensor) -> str:
    """The backend column of a fork path's call, from the fork's record of it (te/status.py).

    Raises NotRunnable when the call fell back to BF16/FP16 attention: its output is exact by
    construction, so counting it as an exact fork row would be a check that cannot fail. Also
    says whether the output equals BF16 attention's bit for bit (it can, e.g. with q = k = ones
    and every V tile at the mask boundary, where the kernels use unquantized V)."""
    if not ran.mask_exact_calls:
        reasons = "; ".join(ran.fallbacks) or "no call asked for mask-exact FP8 attention"
        raise NotRunnable(f"the fork ran BF16/FP16 attention instead, not its kernels ({reasons})")
    same = torch.equal(out, bf16_out)
    return (
        f"TE fork dispatch: mask-exact kernels ({ran.last_kernel_backend}, recipe"
        f" {ran.last_recipe}); " + ("output == BF16 bitwise" if same else "output != BF16 (FP8)")
    )


def te_runner(path: str) -> Callable:
    """run(q, k, v, kw) -> (out, backend description) through TE for `path`.

    Raises NotRunnable when the path cannot run on this GPU/TE, or when TE refuses the scenario
    (e.g. "No dot product attention backend is available"); the message says why.
    """
    os.environ[DETERMINISM_ENV] = "0"
    plan = plan_te_path(path, torch.cuda.get_device_capability(), _has_mask_exact_field())
    if plan.not_runnable:
        raise NotRunnable(plan.not_runnable)
    bf16 = plan_te_path("bf16", (0, 0), False)

    def run(q, k, v, kw):
        with _env(EMULATE_ENV, "1" if plan.emulate_fp8 else None), _collect_messages() as msgs:
            status.reset()
            try:
                out = _call_dpa(plan, q, k, v, kw)
            except (ValueError, RuntimeError, AssertionError, NotImplementedError) as err:
                first = (str(err).strip().splitlines() or [""])[0]
                raise NotRunnable(f"TE refused it: {type(err).__name__}: {first}") from err
            if plan.path.startswith("fork-"):
                ran = status.status()
                backend = fork_backend(ran, out, _call_dpa(bf16, q, k, v, kw))
            else:
                backend = _upstream_backend(plan)
        if msgs:
            backend += f"; logged: {msgs[0][:120]}"
        return out, backend

    return run
