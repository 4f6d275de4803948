"""Causality scenarios: a base input, a perturbation of tokens the mask hides from some rows, and
the output rows that must not change. Shared by the causality audit and the tests.

The three `report-*` scenarios are the upstream bug report's repro (NVIDIA/TransformerEngine#3248):
sbhd [S=128, b=1, h=1, d=128], q = k = ones, causal, rows 0..7 compared.
"""

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch

__all__ = [
    "Scenario",
    "REPORT_SCENARIOS",
    "RANDOM_SCENARIOS",
    "build_scenario",
    "scenario_names",
    "randn_with_outliers",
    "large_garbage",
    "perturb_tokens",
]


@dataclass
class Scenario:
    """Inputs of one causality check. `protected[t]` (over the flattened output tokens of the
    qkv format, see masks.to_tokens) marks outputs that must not change."""

    name: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q2: torch.Tensor  # perturbed copies
    k2: torch.Tensor
    v2: torch.Tensor
    protected: torch.Tensor  # [t_q] bool
    kwargs: Dict = field(default_factory=dict)  # qkv_format, attn_mask_type, window_size, ...


def _report(name: str, base: float, future: float, pos: int) -> Scenario:
    s, d = 128, 128
    q = torch.ones(s, 1, 1, d, dtype=torch.bfloat16)
    v = torch.zeros(s, 1, 1, d, dtype=torch.bfloat16)
    v[0, 0, 0, 0] = base
    v2 = v.clone()
    v2[pos, 0, 0, 0] = future
    protected = torch.arange(s) <= 7
    kw = dict(qkv_format="sbhd", attn_mask_type="causal")
    return Scenario(name, q, q.clone(), v, q.clone(), q.clone(), v2, protected, kw)


REPORT_SCENARIOS: Dict[str, Callable[[], Scenario]] = {
    # MXFP8: a future V in the same 32-token block pushes V[0, 0] = 2^-20 under the smallest E4M3.
    "report-mx-same-block": lambda: _report("report-mx-same-block", 2.0**-20, 1.0, 16),
    # The same outlier one block later: upstream's MXFP8 does not leak here.
    "report-mx-next-block": lambda: _report("report-mx-next-block", 2.0**-20, 1.0, 32),
    # Current scaling: a future V of 1024 lowers the one global scale, V[0, 0] = 2^-10 underflows.
    "report-current-future": lambda: _report("report-current-future", 2.0**-10, 1024.0, 64),
}


def randn_with_outliers(gen: torch.Generator, *shape, outlier_frac: float = 0.01) -> torch.Tensor:
    """N(0, 1) bf16 with a few x50 outliers, so that scales differ across tokens and channels."""
    x = torch.randn(*shape, generator=gen)
    spikes = torch.rand(*shape, generator=gen) < outlier_frac
    return torch.where(spikes, x * 50, x).to(torch.bfloat16)


def large_garbage(gen: torch.Generator, shape) -> torch.Tensor:
    """Large finite values: they move any scale whose reduction they take part in."""
    mag = 2.0 ** torch.randint(4, 14, shape, generator=gen).float()
    return (torch.randn(*shape, generator=gen) * mag).to(torch.bfloat16)


def perturb_tokens(x: torch.Tensor, where: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """x with the tokens selected by `where` (a mask over x's leading dims) replaced by garbage."""
    where = where.reshape(where.shape + (1,) * (x.dim() - where.dim())).expand_as(x)
    return torch.where(where, large_garbage(gen, x.shape), x)


def _future(tensor_name: str, mask_type: str, gen: torch.Generator) -> Scenario:
    """bshd causal: change Q, K or V at positions > t (t random); rows <= t must not change."""
    b, h, h_kv, d = 2, 2, 1, 64
    s_kv = int(torch.randint(256, 512, (1,), generator=gen))  # > Q_TILE + 100: FP8 tiles
    s_q = s_kv if mask_type == "causal" else s_kv - int(torch.randint(1, 100, (1,), generator=gen))
    q, k, v = (
        randn_with_outliers(gen, b, s_q, h, d),
        randn_with_outliers(gen, b, s_kv, h_kv, d),
        randn_with_outliers(gen, b, s_kv, h_kv, d),
    )
    t = int(torch.randint(0, s_q - 1, (1,), generator=gen))
    off = 0 if mask_type == "causal" else s_kv - s_q  # the last key row t sees is t + off
    tensors = {"q": q, "k": k, "v": v}
    s_pert = s_q if tensor_name == "q" else s_kv
    limit = t if tensor_name == "q" else t + off
    later = (torch.arange(s_pert) > limit).view(1, -1).expand(b, -1)
    pert = dict(tensors)
    pert[tensor_name] = perturb_tokens(tensors[tensor_name], later, gen)
    protected = (torch.arange(s_q) <= t).repeat(b)
    kw = dict(qkv_format="bshd", attn_mask_type=mask_type)
    name = f"random-future-{tensor_name}" + ("-bottom-right" if mask_type != "causal" else "")
    return Scenario(name, q, k, v, pert["q"], pert["k"], pert["v"], protected, kw)


def _other_sample(gen: torch.Generator) -> Scenario:
    """bshd causal, b = 3: change every token of sample 1; samples 0 and 2 must not change."""
    b, s, h, d = 3, 192, 2, 64
    q, k, v = (randn_with_outliers(gen, b, s, h, d) for _ in range(3))
    other = (torch.arange(b) == 1).view(b, 1).expand(b, s)
    q2, k2, v2 = (perturb_tokens(x, other, gen) for x in (q, k, v))
    protected = ~other.reshape(-1)
    kw = dict(qkv_format="bshd", attn_mask_type="causal")
    return Scenario("random-other-sample", q, k, v, q2, k2, v2, protected, kw)


def _thd_other_sequence(gen: torch.Generator) -> Scenario:
    """thd padding_causal, three packed sequences: change sequence 1; 0 and 2 must not change."""
    lens = [int(x) for x in torch.randint(130, 300, (3,), generator=gen)]
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    t, h, d = int(cu[-1]), 2, 64
    q, k, v = (randn_with_outliers(gen, t, h, d) for _ in range(3))
    seq1 = (torch.arange(t) >= cu[1]) & (torch.arange(t) < cu[2])
    q2, k2, v2 = (perturb_tokens(x, seq1, gen) for x in (q, k, v))
    kw = dict(qkv_format="thd", attn_mask_type="padding_causal", cu_seqlens_q=cu, cu_seqlens_kv=cu)
    return Scenario("random-thd-other-sequence", q, k, v, q2, k2, v2, ~seq1, kw)


def _padding(gen: torch.Generator) -> Scenario:
    """bshd padding_causal: garbage in the padded positions must not change the real outputs."""
    b, s, h, d = 2, 256, 2, 64
    lens = [int(x) for x in torch.randint(130, s, (b,), generator=gen)]
    q, k, v = (randn_with_outliers(gen, b, s, h, d) for _ in range(3))
    padded = torch.arange(s).view(1, s) >= torch.tensor(lens).view(b, 1)
    q2, k2, v2 = (perturb_tokens(x, padded, gen) for x in (q, k, v))
    kw = dict(qkv_format="bshd", attn_mask_type="padding_causal", seqlens_q=lens, seqlens_kv=lens)
    return Scenario("random-padding-garbage", q, k, v, q2, k2, v2, ~padded.reshape(-1), kw)


def _window(gen: torch.Generator) -> Scenario:
    """bshd causal with a sliding window (left, 0): changing K/V at position p must not change
    rows whose window starts after p (i - left > p), nor rows before p (the future)."""
    b, s, h, d = 1, 640, 2, 64
    left = int(torch.randint(256, 384, (1,), generator=gen))  # >= 255: some tiles are FP8
    p = int(torch.randint(0, s - left - 2, (1,), generator=gen))
    q, k, v = (randn_with_outliers(gen, b, s, h, d) for _ in range(3))
    at_p = (torch.arange(s) == p).view(1, s)
    k2, v2 = perturb_tokens(k, at_p, gen), perturb_tokens(v, at_p, gen)
    i = torch.arange(s)
    protected = (i - left > p) | (i < p)
    kw = dict(qkv_format="bshd", attn_mask_type="causal", window_size=(left, 0))
    return Scenario("random-window-outside", q, k, v, q.clone(), k2, v2, protected, kw)


RANDOM_SCENARIOS: Dict[str, Callable[[torch.Generator], Scenario]] = {
    "random-future-q": lambda g: _future("q", "causal", g),
    "random-future-k": lambda g: _future("k", "causal", g),
    "random-future-v": lambda g: _future("v", "causal", g),
    "random-future-v-bottom-right": lambda g: _future("v", "causal_bottom_right", g),
    "random-other-sample": _other_sample,
    "random-thd-other-sequence": _thd_other_sequence,
    "random-padding-garbage": _padding,
    "random-window-outside": _window,
}


def scenario_names() -> List[str]:
    return list(REPORT_SCENARIOS) + list(RANDOM_SCENARIOS)


def build_scenario(name: str, gen: Optional[torch.Generator] = None) -> Scenario:
    """Build a scenario by name; random ones draw from `gen` (a CPU generator)."""
    if name in REPORT_SCENARIOS:
        return REPORT_SCENARIOS[name]()
    if name in RANDOM_SCENARIOS:
        return RANDOM_SCENARIOS[name](gen if gen is not None else torch.Generator().manual_seed(0))
    raise ValueError(f"unknown scenario {name!r}; known: {scenario_names()}")
