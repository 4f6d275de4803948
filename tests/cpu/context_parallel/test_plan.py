"""The ring's plan (TE's load-balanced chunking and per-step sections) and the LSE merge."""

import math

import pytest
import torch

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.context_parallel import (
    a2a,
    chunking,
    combine,
)

P = chunking.CP_CHUNK_MULTIPLE


def test_sections_are_tes_table():
    """TE's AttnFuncWithCPAndKVP2P comment for cp = 4, rank x whose K/V -> d(iagonal),
    l(ower-triangle), u(pper-triangle); step i holds the K/V of rank (rank - i) mod cp."""
    table = ["duuu", "lduu", "lldu", "llld"]
    for rank, row in enumerate(table):
        sections = [chunking.step_section(rank, i, 4, True) for i in range(4)]
        assert "".join(row[s.kv_rank] for s in sections) == "".join(s.name[0] for s in sections)
        assert sections[0].name == "diagonal"
        for i in range(4):
            assert chunking.step_section(rank, i, 4, True).kv_rank == (rank - i) % 4
            assert chunking.step_section(rank, i, 4, False).name == "all"


@pytest.mark.parametrize("cp_size", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_steps_compute_every_allowed_pair_exactly_once(cp_size, causal):
    """Over all ranks and steps, each (query, key) pair of the global mask is computed once and
    no hidden pair ever is: the plan is the global attention, split."""
    chunk_len = 3  # the plan is geometry only
    s = 2 * cp_size * chunk_len
    count = torch.zeros(s, s, dtype=torch.int64)
    for rank in range(cp_size):
        for i in range(cp_size):
            section = chunking.step_section(rank, i, cp_size, causal)
            q_pos, kv_pos, allowed = chunking.global_pairs_of_step(
                section, rank, cp_size, chunk_len
            )
            count[q_pos.unsqueeze(1), kv_pos.unsqueeze(0)] += allowed.long()
    want = torch.ones(s, s, dtype=torch.int64)
    assert torch.equal(count, want.tril() if causal else want)


def test_shard_and_unshard():
    x = torch.arange(2 * 24).view(2, 24, 1, 1)
    parts = [chunking.shard(x, r, 3, 1) for r in range(3)]
    assert parts[0][0, :, 0, 0].tolist() == [0, 1, 2, 3, 20, 21, 22, 23]  # chunks 0 and 5
    assert parts[2][1, :, 0, 0].tolist() == [32, 33, 34, 35, 36, 37, 38, 39]  # chunks 2 and 3
    assert torch.equal(chunking.unshard(parts, 3, 1), x)
    assert chunking.local_positions(1, 3, 4).tolist() == [4, 5, 6, 7, 16, 17, 18, 19]


@pytest.mark.parametrize("seqlen,cp_size", [(2 * 2 * P + 64, 2), (2 * 2 * 192, 2), (0, 2)])
def test_ragged_chunks_are_refused(seqlen, cp_size):
    with pytest.raises(ValueError, match="multiples of"):
        chunking.check_seqlen(seqlen, cp_size)
    assert chunking.check_seqlen(2 * 3 * 2 * P, 3) == 2 * P


def test_merge_lse_and_dead_rows():
    ninf = float("-inf")
    a = torch.tensor([0.0, ninf, ninf, 3.0, 1e4])
    b = torch.tensor([0.0, 2.0, ninf, ninf, 1e4 - 100])
    got = combine.merge_lse(a, b)
    want = torch.logaddexp(a.double(), b.double()).float()
    assert torch.equal(torch.isneginf(got), torch.isneginf(want)) and not got.isnan().any()
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    assert got[0] == math.log(2.0) or abs(float(got[0]) - math.log(2.0)) < 1e-7


@pytest.mark.parametrize("q_halves", [("both", "both", "both"), ("both", "second", "both")])
def test_ring_accumulator_is_the_exact_merge(q_halves):
    """Incremental fp32 merge (TE's order) = the one-shot fp64 merge; rows that see nothing in a
    step add exactly nothing, rows that see nothing at all stay 0 with LSE -inf, never NaN."""
    gen = torch.Generator().manual_seed(0)
    b, s, h, d = 2, 8, 3, 4
    acc = combine.RingAccumulator("bshd", (b, s, h, d), "cpu")
    full_outs, full_lses = [], []
    for n, half in enumerate(q_halves):
        rows = s if half == "both" else s // 2
        out = torch.randn(b, rows, h, d, generator=gen).bfloat16()
        lse = torch.randn(h, b, rows, generator=gen) * 4
        lse[:, 0, 1] = float("-inf")  # row 1 of sample 0 sees nothing in any step
        if n == 1:
            lse[:, 1, :] = float("-inf")  # sample 1 sees nothing in this step
        out[torch.isneginf(lse).permute(1, 2, 0)] = 0
        acc.add(out, lse.reshape(h, -1), half)
        # the same step over all rows: the rows it skips see nothing
        full_out = torch.zeros(b, s, h, d, dtype=out.dtype)
        full_lse = torch.full((h, b, s), float("-inf"))
        full_out[:, s - rows :] = out
        full_lse[..., s - rows :] = lse
        full_outs.append(full_out)
        full_lses.append(full_lse.permute(1, 2, 0))
    out, lse = acc.result(torch.float32)
    want_out, want_lse = combine.combine_exact(full_outs, full_lses)
    assert not out.isnan().any() and not lse.isnan().any()
    assert not out[0, 1].any() and torch.isneginf(lse.view(h, b, s)[:, 0, 1]).all()
    torch.testing.assert_close(out.double(), want_out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        lse.view(h, b, s).permute(1, 2, 0).double(), want_lse, atol=1e-5, rtol=0
    )


def test_a2a_head_split():
    assert a2a.head_split(1, 2, 8, 2) == (slice(4, 8), slice(1, 2))
    with pytest.raises(ValueError, match="divide"):
        a2a.head_split(0, 4, 8, 2)
