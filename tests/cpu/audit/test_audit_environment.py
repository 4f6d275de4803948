"""The audit's environment header: the note when TE loaded an older cuDNN than PyTorch's (TE
takes the system's copy first; an older one can disable its FusedAttention)."""

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.audit import te_runner


def test_older_cudnn_is_named_with_the_fix():
    note = te_runner.older_cudnn_note((9, 14, 0), 91900)
    assert note is not None
    assert "9.14.0" in note and "9.19.0" in note and "CUDNN_HOME" in note


def test_same_or_newer_cudnn_or_none_in_torch_gives_no_note():
    assert te_runner.older_cudnn_note((9, 19, 0), 91900) is None
    assert te_runner.older_cudnn_note((9, 20, 1), 91900) is None
    assert te_runner.older_cudnn_note((9, 14, 0), None) is None
    assert te_runner.older_cudnn_note((9, 14, 0), 0) is None
