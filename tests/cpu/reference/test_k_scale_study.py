"""The rules-v3 design study's emulation (benchmarks/attention/bench_k_scale_rules.py) against the
reference: its row-subset attention is reference_attention's, and its v3 rule differs from v2
only on the FP8 tiles (the keys before a row's query tile)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks" / "attention"))

import bench_k_scale_rules as study  # noqa: E402

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.attention import (  # noqa: E402,E501
    reference_attention,
)


def test_row_subset_attention_is_the_references():
    q, k, v = study.family_inputs("outliers-x50", 300, seed=1)
    rows = torch.tensor([0, 5, 127, 128, 200, 299])
    got = study.causal_rows(q, k, k, v, rows)
    ref = reference_attention("bf16", *(x.unsqueeze(0).double() for x in (q, k, v)))
    torch.testing.assert_close(got, ref.out[0, rows], rtol=1e-12, atol=1e-12)


def test_v3_changes_only_the_fp8_tiles():
    q, k, v = study.family_inputs("k-channels-x20", 400, seed=2)
    rows = torch.arange(400)
    v2 = study.causal_rows(*study.rule_operands("v2", q, k, v)[:3], v.double(), rows)
    v3_ops = study.rule_operands("v3", q, k, v)
    v3 = study.causal_rows(*v3_ops[:3], v.double(), rows)
    assert torch.equal(v3[:128], v2[:128])  # the first query tile has no FP8 tile
    assert not torch.equal(v3[128:], v2[128:])
    # K on FP8 tiles: one scale per (128-key chunk, head), the chunk's amax at E4M3's maximum;
    # on boundary tiles one per (key, head), each key's amax there
    amax_chunk = k[:128].double().abs().amax(dim=(0, 2))  # [h]
    torch.testing.assert_close(
        v3_ops[1][:128].abs().amax(dim=(0, 2)), amax_chunk, rtol=1e-6, atol=0
    )
    amax_token = k.double().abs().amax(dim=-1)  # [s, h]
    torch.testing.assert_close(v3_ops[2].abs().amax(dim=-1), amax_token, rtol=1e-6, atol=0)
    assert not torch.allclose(v3_ops[1].abs().amax(dim=-1), amax_token, rtol=1e-3)
