"""The FP8-backward design study's emulation (benchmarks/attention/bench_backward_fp8_rules.py):
its bf16 rule is the reference backward's math with the kernels' bf16 roundings, and every rule
keeps the backward's invariant (DESIGN.md section 2) bit for bit: a loss over rows <= t gives
prefix gradients that no value of a later token changes. The negative control, the folded dV tile
with scale 1 for a token of zeros, leaks and must be caught."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks" / "attention"))

import bench_backward_fp8_rules as study  # noqa: E402

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import (  # noqa: E402,E501
    SeqLayout,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.attention import (  # noqa: E402,E501
    dequantized_operands,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.backward import (  # noqa: E402,E501
    reference_attention_backward,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (  # noqa: E402,E501
    rel_frobenius_error,
)

S, T = 256, 100  # tokens; the loss covers rows 0..T


def _inputs(seed=0):
    q, k, v, d_out = study.study_inputs("outliers-x50", S, seed)
    d_out[:, T + 1 :] = 0  # the loss reaches rows <= T only
    return q, k, v, d_out


def _future(x, value):
    """x with every token after T replaced by `value` times its pattern (bf16 range)."""
    y = x.clone()
    y[:, T + 1 :] = (torch.sign(y[:, T + 1 :].float()) * value).bfloat16()
    return y


def _prefix(grads):
    return [g[: T + 1] for g in grads]


def test_forward_operands_are_the_forwards():
    q, k, v, d_out = _inputs()
    q8, s_q, k8, s_k, *_ = study.forward_operands(q, k, v, d_out)
    q_dq, k_dq, _ = dequantized_operands("fork-current", q[0], k[0], v[0], SeqLayout.dense(1, S))
    assert torch.equal(q8 * s_q, q_dq.transpose(0, 1)) and torch.equal(
        k8 * s_k, k_dq.transpose(0, 1)
    )


def test_bf16_rule_is_the_reference_backward_up_to_bf16_roundings():
    q, k, v, d_out = _inputs()
    got = study.rule_gradients("bf16 (the kernels today)", *study.forward_operands(q, k, v, d_out))
    out = study.reference_attention("fork-current", q, k, v, attn_mask_type="causal").out
    ref = reference_attention_backward("current", q, k, v, out, d_out)
    for g, r in zip(got, ref):
        # P, dS and the dequantized Q, K rounded to bf16 (unit roundoff 2^-8 = 3.9e-3): a few
        # roundoffs normwise; a wrong product or scale is off by order 1
        assert rel_frobenius_error(g, r[0].double()) < 1.6e-2


@pytest.mark.parametrize("rule", list(study.RULES))
@pytest.mark.parametrize("target", ["q", "k", "v"])
@pytest.mark.parametrize("value", [3e4, 1e7, 3e38])
def test_future_values_change_no_prefix_gradient_bit(rule, target, value):
    q, k, v, d_out = _inputs()
    base = _prefix(study.rule_gradients(rule, *study.forward_operands(q, k, v, d_out)))
    inputs = dict(q=q, k=k, v=v)
    inputs[target] = _future(inputs[target], value)
    after = study.rule_gradients(rule, *study.forward_operands(**inputs, d_out=d_out))
    for b, a in zip(base, _prefix(after)):
        assert torch.equal(b, a), (rule, target, value)


def test_negative_control_scale_one_for_zero_tokens_leaks():
    q, k, v, d_out = _inputs()
    rule = "dV, dK, dQ in FP8 (dS E4M3), dP bf16"
    run = lambda q_: study.rule_gradients(
        rule, *study.forward_operands(q_, k, v, d_out), zero_scale=1.0
    )
    base, after = _prefix(run(q)), _prefix(run(_future(q, 3e4)))
    # dv: the future rows' probabilities enter the amax of the prefix rows of their 64-row block
    assert not torch.equal(base[2], after[2])
