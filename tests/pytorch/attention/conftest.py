"""Fixtures shared by the GPU attention tests: which mask-exact kernels a test's calls ran."""

import pytest


def _count_recipes(monkeypatch, module, name):
    """Wrap module.name so that each call's recipe is recorded; returns the list of recipes."""
    runs = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        runs.append(kwargs["recipe"])
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return runs


@pytest.fixture
def kernel_runs(monkeypatch):
    """The recipes of the mask-exact forward calls made during a test (any kernel backend)."""
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import kernels

    return _count_recipes(monkeypatch, kernels, "attention_forward")


@pytest.fixture
def backward_runs(monkeypatch):
    """The recipes of the mask-exact backward calls made during a test (any kernel backend)."""
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import kernels

    return _count_recipes(monkeypatch, kernels, "attention_backward")
