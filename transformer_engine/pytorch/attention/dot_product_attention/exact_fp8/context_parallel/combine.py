"""The LSE merge of a ring's partial results, as TE's AttnFuncWithCPAndKVP2P merges them.

Step i of a rank gives a partial output O_i (normalized over the keys of that step) and its
log-sum-exp lse_i per query row (natural log, fp32). The merged result is

    lse = logsumexp_i lse_i,    O = sum_i exp(lse_i - lse) * O_i

computed incrementally in step order, as TE does (flash_attn_fwd_softmax_lse_correction and
flash_attn_fwd_incremental_out_correction): lse <- max + log1p(exp(min - max)), then
O <- O * exp(lse_old - lse) + O_i * exp(lse_i - lse), in fp32. Upper-triangle steps update the
second half of the local rows only (TE's *_second_half_* corrections), so the first half's
arithmetic never sees them.

A row that sees nothing in a step has lse_i = -inf and O_i = 0 (the kernel's convention): it
contributes exactly 0. A row that has seen nothing yet (lse = -inf) merges to the step's values,
and a row that sees nothing in any step stays O = 0, lse = -inf: the merge never forms
-inf - (-inf) (TE's formulas would give NaN there; with TE's causal chunking that cannot happen
for real rows, but padding can).
"""

import torch

__all__ = ["merge_lse", "RingAccumulator", "combine_exact"]


def merge_lse(lse: torch.Tensor, lse_step: torch.Tensor) -> torch.Tensor:
    """log(exp(lse) + exp(lse_step)) element-wise, as TE computes it, -inf when both are."""
    hi = torch.maximum(lse, lse_step)
    lo = torch.minimum(lse, lse_step)
    merged = hi + torch.log1p(torch.exp(lo - hi))
    return torch.where(torch.isneginf(hi), hi, merged)


def _weight(lse_part: torch.Tensor, lse_new: torch.Tensor) -> torch.Tensor:
    """exp(lse_part - lse_new), 0 where lse_new is -inf (then lse_part is -inf as well)."""
    dead = torch.isneginf(lse_new)
    return torch.where(dead, torch.zeros_like(lse_new), torch.exp(lse_part - lse_new))


class RingAccumulator:
    """One rank's merged output (fp32, q's layout) and LSE ([h, b, s_local] fp32).

    add(out_i, lse_i, q_half): a step's output (q's layout over the step's rows, any float dtype)
    and LSE ([h, b * s_rows], the kernel's token-major LSE); q_half "both" or "second"."""

    def __init__(self, qkv_format: str, local_shape, device):
        if qkv_format not in ("bshd", "sbhd"):
            raise ValueError(f"qkv_format must be bshd or sbhd, got {qkv_format!r}")
        self.qkv_format = qkv_format
        self.seq_dim = qkv_format.index("s")
        self.batch = local_shape[qkv_format.index("b")]
        self.seqlen = local_shape[self.seq_dim]
        self.heads = local_shape[2]
        self.out = None
        self.lse = None
        self.shape = tuple(local_shape)
        self.device = device

    def _rows(self, x: torch.Tensor, q_half: str) -> torch.Tensor:
        if q_half == "both":
            return x
        return x.narrow(self.seq_dim, self.seqlen // 2, self.seqlen // 2)

    def _lse_rows(self, q_half: str) -> torch.Tensor:
        if q_half == "both":
            return self.lse
        return self.lse[..., self.seqlen // 2 :]

    def _to_out_layout(self, lse: torch.Tensor) -> torch.Tensor:
        """[h, b, s] -> broadcastable against the output: [b, s, h, 1] or [s, b, h, 1]."""
        order = (1, 2, 0) if self.qkv_format == "bshd" else (2, 1, 0)
        return lse.permute(order).unsqueeze(-1)

    def add(self, out_step: torch.Tensor, lse_step: torch.Tensor, q_half: str) -> None:
        lse_step = lse_step.float().view(self.heads, self.batch, -1)
        if self.out is None:  # TE's first step: the partial results themselves
            if q_half != "both":
                raise ValueError("the first step of a ring covers every local row")
            self.out = out_step.float().clone()
            self.lse = lse_step.clone()
            return
        out = self._rows(self.out, q_half)
        lse = self._lse_rows(q_half)
        new = merge_lse(lse, lse_step)
        scale_old = self._to_out_layout(_weight(lse, new))
        scale_new = self._to_out_layout(_weight(lse_step, new))
        out.mul_(scale_old)
        out.addcmul_(out_step.float(), scale_new)
        lse.copy_(new)

    def result(self, dtype: torch.dtype):
        """(out in `dtype`, q's local layout; lse [h, b * s_local] fp32, token-major)."""
        return self.out.to(dtype), self.lse.reshape(self.heads, -1)


def combine_exact(outs, lses):
    """The merge in one go, fp64 (the oracle of RingAccumulator): outs [n] tensors of one shape
    [..., h, d] with lses [n] of shape [...,  h] (natural log; -inf: the part saw nothing)."""
    lse_all = torch.stack([x.double() for x in lses])
    lse = torch.logsumexp(lse_all, dim=0)
    out = torch.zeros_like(outs[0], dtype=torch.float64)
    for o, l in zip(outs, lse_all):
        out += _weight(l, lse).unsqueeze(-1) * o.double()
    return out, lse
