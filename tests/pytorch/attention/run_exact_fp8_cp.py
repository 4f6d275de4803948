"""Mask-exact FP8 attention over a real context-parallel ring: one process per GPU (torchrun).

NEVER RUN ON HARDWARE SO FAR: written and checked on one GPU's worth of logic only (the
one-process simulator, tests/pytorch/attention/test_exact_fp8_context_parallel.py); the first
multi-GPU run is issue 22's. Launched by that file's test_multi_gpu_ring:

    torchrun --standalone --nproc-per-node=2 tests/pytorch/attention/run_exact_fp8_cp.py

Each rank holds TE's load-balanced shard (chunks r and 2 cp - 1 - r), quantizes its own K and V
(context_parallel.payload), and runs the ring: at each step it sends the payload it holds to
rank + 1 and receives rank - 1's (NCCL isend/irecv of the FP8 bytes and the scales, as TE's
flash_attn_p2p_communicate does with BF16 K/V), computing the step meanwhile
(context_parallel.steps.kernel_step_forward). Checks, per recipe:

  * the distributed ring's output is, bit for bit, the one-process simulator's (same steps,
    same merge), and within the simulator's tolerance of the single call;
  * prefix invariance across ranks: positions > t (on later ranks) set to large finite values
    change no output at positions <= t on any rank, bitwise;
  * batch isolation: sample 1 changes nothing of sample 0.

Exit status 0 when every check passed on every rank. This is the forward only: the backward
ring waits for the rewritten backward (issue 21; docs/context_parallel.md).
"""

import os
import sys

import torch
import torch.distributed as dist

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import kernels
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.context_parallel import (
    chunking,
    payload as cp_payload,
    ring,
    simulate,
    steps,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
    rel_frobenius_error,
)

B, H, H_KV, D, CHUNK = 2, 8, 2, 128, 512


def _bytes(x):
    return x.contiguous().view(torch.uint8)


def _exchange(held, rank, cp_size):
    """Start sending `held` to rank + 1 and receiving rank - 1's payload: (requests, buffers)."""
    send = [_bytes(x) for x in held.wire()]
    recv = [torch.empty_like(x) for x in send]
    ops = []
    for x in send:
        ops.append(dist.P2POp(dist.isend, x, (rank + 1) % cp_size))
    for x in recv:
        ops.append(dist.P2POp(dist.irecv, x, (rank - 1) % cp_size))
    return dist.batch_isend_irecv(ops), recv


def _typed(buffers, like):
    return [b.view(x.dtype).view(x.shape) for b, x in zip(buffers, like.wire())]


def ring_forward(q, k, v, recipe, cp_size, rank):
    """This rank's (out, lse) of the global q, k, v [b, s, h, d] (every rank holds the same
    global tensors here, and takes its shard)."""
    local = [chunking.shard(x, rank, cp_size, 1) for x in (q, k, v)]
    held = cp_payload.quantize_kv(local[1], local[2], rank=rank, recipe=recipe)
    fwd = ring.RankForward(
        rank, cp_size, local[0], causal=True, qkv_format="bshd",
        step_forward=steps.kernel_step_forward,
    )  # fmt: skip
    for i in range(cp_size):
        reqs, recv = _exchange(held, rank, cp_size) if i < cp_size - 1 else ([], None)
        fwd.step(i, held)
        for req in reqs:
            req.wait()
        if recv is not None:
            held = held.received(_typed(recv, held), rank=(rank - i - 1) % cp_size)
    return fwd.result()


def _large(shape, seed):
    """Large finite BF16 values, the same on every rank."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=gen, device="cuda") * 3e4).bfloat16()


def _gather(x, cp_size):
    parts = [torch.empty_like(x) for _ in range(cp_size)]
    dist.all_gather(parts, x.contiguous())
    return parts


def main() -> int:
    dist.init_process_group("nccl")
    rank, cp_size = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    gen = torch.Generator(device="cuda").manual_seed(0)
    s = 2 * cp_size * CHUNK
    q, k, v = (
        torch.randn(B, s, h, D, generator=gen, device="cuda").bfloat16() for h in (H, H_KV, H_KV)
    )
    failures = []
    for recipe in ("current", "mxfp8"):
        out, lse = ring_forward(q, k, v, recipe, cp_size, rank)
        glob = chunking.unshard(_gather(out, cp_size), cp_size, 1)
        sim = simulate.simulate_forward(
            q, k, v, cp_size, recipe=recipe, causal=True, step_forward=steps.kernel_step_forward
        )
        if not torch.equal(glob, sim.out):
            failures.append(f"{recipe}: the distributed ring differs from the simulator")
        single, _ = kernels.attention_forward(q, k, v, recipe=recipe, attn_mask_type="causal")
        err = rel_frobenius_error(glob, single)
        if rank == 0:
            print(f"{recipe}: cp={cp_size} s={s} ring vs single call {err:.3e}", flush=True)
        t = s // 2 + 100  # inside a chunk of rank cp - 1 (in the second half of the sequence)
        pert = [x.clone() for x in (q, k, v)]
        for x in pert:  # the same values on every rank: a seeded generator
            x[:, t + 1 :] = _large(x[:, t + 1 :].shape, 1)
        out2, _ = ring_forward(*pert, recipe, cp_size, rank)
        glob2 = chunking.unshard(_gather(out2, cp_size), cp_size, 1)
        if not torch.equal(glob[:, : t + 1], glob2[:, : t + 1]):
            failures.append(f"{recipe}: a future token on another rank changed the prefix")
        other = [x.clone() for x in (q, k, v)]
        for x in other:
            x[1] = _large(x[1].shape, 2)
        out3, _ = ring_forward(*other, recipe, cp_size, rank)
        if not torch.equal(out3[0], out[0]):
            failures.append(f"{recipe}: sample 1 changed sample 0 on rank {rank}")
        del lse
    for line in failures:
        print(f"rank {rank}: FAILED {line}", flush=True)
    status = torch.tensor([len(failures)], device="cuda")
    dist.all_reduce(status)
    dist.destroy_process_group()
    return 0 if int(status) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
