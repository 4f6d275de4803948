"""One rank's part of the ring (TE's AttnFuncWithCPAndKVP2P), step by step, without communication.

A real ring (TE's, patched: docs/context_parallel.md) or the one-process simulator (simulate.py)
drives these: at step i, rank r holds the K/V of rank (r - i) mod cp and

  forward   RankForward.step(i, payload): the step's partial result through a StepForward
            (steps.kernel_step_forward on the GPU), merged by combine.RingAccumulator
  backward  RankBackward.step(i, kv, dkv): the step's gradients through a StepBackward, dq
            accumulated here, dk/dv added to the travelling accumulator of that K/V (which
            returns to its owner after cp steps), as TE's ring backward does

The backward sees the merged LSE and output of the forward (never a step's own), so that
P = exp(S - lse) and D = rowsum(dO * O) are those of the whole softmax, as in TE; see
docs/context_parallel.md for what its kernels are (being rewritten, issue 21).
"""

from typing import Callable, Tuple

import torch

from .chunking import Section, step_section
from .combine import RingAccumulator
from .payload import KVPayload
from .steps import StepForward, query_rows

__all__ = ["StepBackward", "RankForward", "RankBackward"]

StepBackward = Callable[..., Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
"""(q_rows, k_keys, v_keys, out_rows, dout_rows, lse_rows, causal) -> (dq_rows, dk_keys, dv_keys):
the gradient contributions of one step, with out and lse the merged forward's (lse_rows
[h, b * rows] fp32) and `causal` the step's top-left causal mask (else none)."""


class RankForward:
    """Rank `rank`'s ring forward: step(i, payload) for i = 0 .. cp - 1, then result()."""

    def __init__(self, rank, cp_size, q, *, causal, qkv_format, step_forward: StepForward):
        self.rank, self.cp_size, self.q, self.causal = rank, cp_size, q, causal
        self.qkv_format = qkv_format
        self.step_forward = step_forward
        self.acc = RingAccumulator(qkv_format, q.shape, q.device)
        self.sections = []

    def step(self, i: int, payload: KVPayload) -> None:
        section = step_section(self.rank, i, self.cp_size, self.causal)
        if payload.rank != section.kv_rank:
            raise ValueError(f"step {i} of rank {self.rank} needs rank {section.kv_rank}'s K/V")
        out, lse = self.step_forward(self.q, payload, section)
        self.acc.add(out, lse, section.q_half)
        self.sections.append(section)

    def result(self):
        """(out in q's dtype, lse [h, b * 2 L] fp32)."""
        return self.acc.result(self.q.dtype)


def _keys(x: torch.Tensor, section: Section, seq_dim: int) -> torch.Tensor:
    if section.kv_half == "both":
        return x
    return x.narrow(seq_dim, 0, x.shape[seq_dim] // 2)


class RankBackward:
    """Rank `rank`'s ring backward: step(i, (k, v), dkv) -> dkv for i = 0 .. cp - 1, then dq().

    q, out, dout: local [b, 2 L, h, d] (bshd) or [2 L, b, h, d]; lse: the merged [h, b * 2 L].
    (k, v): the high-precision K and V of the step's rank (the whole local 2 L); dkv: the
    travelling (dk, dv) fp32 accumulator of that K/V (None at step 0: zeros)."""

    def __init__(self, rank, cp_size, q, out, dout, lse, *, causal, qkv_format, step_backward):
        self.rank, self.cp_size, self.causal = rank, cp_size, causal
        self.fmt = qkv_format
        self.seq_dim = qkv_format.index("s")
        self.q, self.out, self.dout = q, out, dout
        batch = q.shape[qkv_format.index("b")]
        self.lse = lse.view(lse.shape[0], batch, -1)
        self.step_backward = step_backward
        self.dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)

    def step(self, i: int, kv, dkv):
        section = step_section(self.rank, i, self.cp_size, self.causal)
        k, v = kv
        rows = lambda x: query_rows(x, section, self.fmt)  # noqa: E731
        lse = self.lse if section.q_half == "both" else self.lse[..., self.lse.shape[-1] // 2 :]
        dq, dk, dv = self.step_backward(
            rows(self.q), _keys(k, section, self.seq_dim), _keys(v, section, self.seq_dim),
            rows(self.out), rows(self.dout), lse.reshape(lse.shape[0], -1), section.causal,
        )  # fmt: skip
        rows(self.dq_acc).add_(dq.float())
        if dkv is None:
            dkv = tuple(torch.zeros(k.shape, dtype=torch.float32, device=k.device) for _ in "kv")
        _keys(dkv[0], section, self.seq_dim).add_(dk.float())
        _keys(dkv[1], section, self.seq_dim).add_(dv.float())
        return dkv

    def dq(self) -> torch.Tensor:
        return self.dq_acc
