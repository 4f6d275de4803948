"""A context-parallel ring in one process: ranks simulated by splitting the sequence.

`simulate_forward(q, k, v, cp_size, ...)` shards the global q, k, v [b, s, h, d] (bshd) or
[s, b, h, d] (sbhd) as TE's load-balanced causal chunking does (chunking.shard), lets every rank
quantize its own K and V (payload.quantize_kv, or a `quantize` stand-in: the tests' leaky
controls), and runs the ring in lockstep: at step i every rank computes its section on the
payload of rank (r - i) mod cp, received through wire() / received() (a copy of exactly the
tensors that travel, without the unquantized V), and merges it (combine.RingAccumulator). The
ranks' outputs go back to global order (chunking.unshard).

`simulate_backward` runs ring.RankBackward the same way, the dk/dv accumulator travelling with
its K/V and returning to its owner after cp steps.
"""

from dataclasses import dataclass
from typing import Callable, List, Optional

import torch

from .chunking import check_seqlen, shard, unshard
from .payload import KVPayload, quantize_kv
from .ring import RankBackward, RankForward, StepBackward
from .steps import StepForward

__all__ = ["RingResult", "simulate_forward", "simulate_backward"]


@dataclass
class RingResult:
    out: torch.Tensor  # global order, q's layout and dtype
    lse: torch.Tensor  # [h, b, s] fp32, global order
    rank_out: List[torch.Tensor]  # per rank, local order
    rank_lse: List[torch.Tensor]  # per rank [h, b * 2 L]
    payloads: List[KVPayload]


def _send(payload: KVPayload) -> KVPayload:
    """What the next rank holds after one ring hop: copies of the wire tensors only."""
    return payload.received([x.clone() for x in payload.wire()])


def simulate_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cp_size: int,
    *,
    recipe: str,
    causal: bool,
    step_forward: StepForward,
    qkv_format: str = "bshd",
    quantize: Optional[Callable[..., KVPayload]] = None,
    q_fp8_of: Optional[Callable[[torch.Tensor], tuple]] = None,
    **quant_kwargs,
) -> RingResult:
    """The ring's output in global order. step_forward(q_local, payload, section[, q_fp8=])
    computes a step; quantize(k_local, v_local, rank=, recipe=, qkv_format=, **quant_kwargs)
    builds a rank's payload (default payload.quantize_kv); q_fp8_of(q_local): a pre-quantized
    local Q handed to step_forward as q_fp8 (the interpreter's route)."""
    seq_dim = qkv_format.index("s")
    check_seqlen(q.shape[seq_dim], cp_size)
    quantize = quantize or quantize_kv
    qs = [shard(q, r, cp_size, seq_dim) for r in range(cp_size)]
    payloads = [
        quantize(
            shard(k, r, cp_size, seq_dim), shard(v, r, cp_size, seq_dim),
            rank=r, recipe=recipe, qkv_format=qkv_format, **quant_kwargs,
        )
        for r in range(cp_size)
    ]  # fmt: skip
    ranks = []
    for r in range(cp_size):
        fn = step_forward
        if q_fp8_of is not None:
            q8 = q_fp8_of(qs[r])
            fn = lambda q_, p_, s_, fn=step_forward, q8=q8: fn(q_, p_, s_, q_fp8=q8)  # noqa: E731
        ranks.append(RankForward(r, cp_size, qs[r], causal=causal, qkv_format=qkv_format,
                                 step_forward=fn))  # fmt: skip
    held = list(payloads)  # held[r]: the payload rank r computes with at this step
    for i in range(cp_size):
        for r in range(cp_size):
            ranks[r].step(i, held[r])
        held = [_send(held[(r - 1) % cp_size]) for r in range(cp_size)]
    results = [rank.result() for rank in ranks]
    batch = q.shape[qkv_format.index("b")]
    lse_local = [lse.view(lse.shape[0], batch, -1) for _, lse in results]
    return RingResult(
        out=unshard([o for o, _ in results], cp_size, seq_dim),
        lse=unshard(lse_local, cp_size, 2),
        rank_out=[o for o, _ in results],
        rank_lse=[lse for _, lse in results],
        payloads=payloads,
    )


def simulate_backward(
    q, k, v, out, dout, lse, cp_size, *, causal, step_backward: StepBackward, qkv_format="bshd"
):
    """(dq, dk, dv) fp32 in global order from the ring backward. q, k, v, out, dout: global;
    lse [h, b, s] (RingResult.lse); k, v: the high-precision K and V the backward reads."""
    seq_dim = qkv_format.index("s")
    check_seqlen(q.shape[seq_dim], cp_size)
    local = lambda x, r: shard(x, r, cp_size, seq_dim)  # noqa: E731
    ranks = [
        RankBackward(
            r, cp_size, local(q, r), local(out, r), local(dout, r),
            shard(lse, r, cp_size, 2).reshape(lse.shape[0], -1),
            causal=causal, qkv_format=qkv_format, step_backward=step_backward,
        )
        for r in range(cp_size)
    ]  # fmt: skip
    kvs = [(local(k, r), local(v, r)) for r in range(cp_size)]
    held = [(r, None) for r in range(cp_size)]  # (whose K/V, its travelling dkv)
    for i in range(cp_size):
        held = [(src, ranks[r].step(i, kvs[src], dkv)) for r, (src, dkv) in enumerate(held)]
        held = [held[(r - 1) % cp_size] for r in range(cp_size)]  # one hop, K/V with its dkv
    dkv = {src: acc for src, acc in held}  # after cp hops every accumulator is home
    assert all(src == r for r, (src, _) in enumerate(held))
    dq = unshard([rank.dq() for rank in ranks], cp_size, seq_dim)
    dk = unshard([dkv[r][0] for r in range(cp_size)], cp_size, seq_dim)
    dv = unshard([dkv[r][1] for r in range(cp_size)], cp_size, seq_dim)
    return dq, dk, dv
