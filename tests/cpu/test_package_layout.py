"""The package's layout (docs/architecture.md): the production path loads no oracle or audit
module, old module paths are gone, and kernels.attention_forward / attention_backward are the
kernel entry points."""

import json
import subprocess
import sys

import pytest
import torch

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import kernels

PKG = "transformer_engine.pytorch.attention.dot_product_attention.exact_fp8"

# The modules of one FP8 call (docs/architecture.md, "One FP8 call").
PRODUCTION = ["te.backend", "te.autograd", "te.recipe", "kernels", "quantize", "masks", "formats"]
NOT_PRODUCTION = ("reference", "audit", "testing")


def _loaded_after_import(modules, code: str = "") -> list:
    """The exact_fp8 modules a fresh interpreter has loaded after importing `modules` and
    running `code`."""
    script = "\n".join(
        ["import json, sys"]
        + [f"import {PKG}.{m}" for m in modules]
        + [code, f"print(json.dumps(sorted(m for m in sys.modules if m.startswith('{PKG}.'))))"]
    )
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    return [m[len(PKG) + 1 :] for m in json.loads(out.stdout.splitlines()[-1])]


def _oracle_or_tool(loaded: list) -> list:
    return [m for m in loaded if m.split(".")[0] in NOT_PRODUCTION]


def test_production_path_imports_no_oracle_and_no_audit():
    loaded = _loaded_after_import(PRODUCTION)
    assert "te.backend" in loaded and "kernels" in loaded
    assert _oracle_or_tool(loaded) == []


def test_triton_backend_imports_no_oracle():
    pytest.importorskip("triton", reason="the Triton backend needs Triton")
    loaded = _loaded_after_import(["triton.attention", "triton.backward"])
    assert "triton.attention_kernel" in loaded and "triton.backward_kernel" in loaded
    assert _oracle_or_tool(loaded) == []


def test_cuda_backend_imports_no_oracle_and_chooses_triton_without_its_kernels():
    """The CUDA backend's launchers load no oracle; on a machine without its kernels (or an
    sm90 GPU) both passes choose the Triton backend, and a forced CUDA backward says why not."""
    loaded = _loaded_after_import(["cuda.attention", "cuda.backward"])
    assert "cuda.backward" in loaded and _oracle_or_tool(loaded) == []
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.cuda import backward

    if kernels.backend_available("cuda"):
        pytest.skip("this machine runs the CUDA kernels")
    q = torch.zeros(1, 4, 2, 128, dtype=torch.bfloat16)
    assert kernels.choose_backward_backend(q, q, q, recipe="current") == "triton"
    reason = backward.backward_supported(q, q, q, recipe="current")
    assert reason is not None
    with pytest.raises(ValueError, match="does not run this call"):
        kernels.attention_backward(
            q, q, q, q, q, torch.zeros(2, 4), backend="cuda", recipe="current"
        )


def test_quantize_cpu_fallback_is_the_one_route_into_the_reference():
    code = (
        "import torch\n"
        f"from {PKG} import quantize\n"
        "quantize.per_token_cast_to_fp8(torch.ones(1, 4, 2, 64).bfloat16(), qkv_format='bshd')"
    )
    loaded = _loaded_after_import(["quantize"], code)
    assert _oracle_or_tool(loaded) == ["reference", "reference.quantize"]


@pytest.mark.parametrize(
    "old",
    ["attention", "attention_kernel", "kernel_masking", "kernel_scaling", "qk_roundtrip", "backend"]
    + ["autograd", "te_recipe", "quantize_reference", "reference_attention", "audit_te"]
    + ["audit_plot", "scenarios", "triton.qk_roundtrip"],
)
def test_old_module_paths_are_gone(old):
    with pytest.raises(ModuleNotFoundError):
        __import__(f"{PKG}.{old}")


def test_kernel_backend_selection():
    assert kernels.select_backend() in kernels.BACKENDS
    assert kernels.head_dims("triton") == (64, 128)
    with pytest.raises(ValueError, match="backend must be one of"):
        kernels.head_dims("cudnn")


def test_attention_forward_runs_the_selected_backends_launcher(monkeypatch):
    pytest.importorskip("triton", reason="the Triton backend needs Triton")
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton import (
        attention as launcher,
    )

    calls = []

    def fake(q, k, v, **kwargs):
        calls.append(kwargs)
        return q, torch.zeros(1)

    monkeypatch.setattr(launcher, "exact_fp8_attention_forward", fake)
    q = torch.zeros(1, 2, 1, 64)
    out, _ = kernels.attention_forward(q, q, q, recipe="current", attn_mask_type="causal")
    assert out is q and calls == [dict(recipe="current", attn_mask_type="causal")]


def test_attention_backward_runs_the_triton_backward(monkeypatch):
    pytest.importorskip("triton", reason="the Triton backend needs Triton")
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton import (
        backward as launcher,
    )

    calls = []

    def fake(q, k, v, out, d_out, lse, **kwargs):
        calls.append(kwargs)
        return q, k, v

    monkeypatch.setattr(launcher, "exact_fp8_attention_backward", fake)
    q = torch.zeros(1, 2, 1, 64)
    grads = kernels.attention_backward(q, q, q, q, q, torch.zeros(1, 2), recipe="mxfp8")
    assert grads == (q, q, q) and calls == [dict(recipe="mxfp8")]


def test_cuda_backend_is_listed_and_chosen_only_where_it_runs(monkeypatch):
    """The sm90 CUDA kernel is a named backend; without an sm90 GPU and the extension's kernel it
    is not available, and then the default (auto) choice is the Triton kernel."""
    monkeypatch.delenv(kernels.BACKEND_ENV, raising=False)
    assert kernels.BACKENDS == ("triton", "cuda")
    assert kernels.head_dims("cuda") == (64, 128)
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.cuda import attention

    sm90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    assert kernels.backend_available("cuda") == (sm90 and attention.extension_has_kernel())
    if not torch.cuda.is_available():
        assert not kernels.backend_available("cuda")
    expected = "cuda" if kernels.backend_available("cuda") else "triton"
    assert kernels.select_backend() == expected
    with pytest.raises(ValueError, match="backend must be one of"):
        kernels.attention_forward(None, None, None, backend="cudnn")


def test_auto_choice_sends_a_leaky_call_the_cuda_kernel_refuses_to_triton(monkeypatch):
    """fp8_v_everywhere (the leaky benchmark / negative-control mode) is a call like any other
    for the choice: the CUDA kernel's variant needs s_kv a multiple of 128, so a call with 16
    keys runs the Triton kernel (checked before any device work, so also on a CPU machine)."""
    monkeypatch.delenv(kernels.BACKEND_ENV, raising=False)
    monkeypatch.setattr(kernels, "select_backend", lambda forced=None: "cuda")
    x = torch.zeros(1, 16, 2, 128, dtype=torch.bfloat16)
    kw = dict(recipe="current", qkv_format="bshd", attn_mask_type="causal", fp8_v_everywhere=True)
    assert kernels._choose(x, x, x, kw) == ("triton", False)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(recipe="mxfp8"), "recipe 'mxfp8'"),
        (dict(qkv_format="thd"), "thd needs cu_seqlens_q and cu_seqlens_kv"),
        (dict(fp8_v_everywhere=True, attn_mask_type="padding"), "leaky variant"),
        (dict(fp8_v_everywhere=True, window_size=(64, 0)), "leaky variant"),
    ],
)
def test_cuda_backend_refuses_what_it_does_not_run(change, match):
    """Checked before any device work, so also on a CPU-only machine."""
    x = torch.zeros(1, 16, 2, 128, dtype=torch.bfloat16)
    kw = dict(recipe="current", qkv_format="bshd", attn_mask_type="causal")
    kw.update(change)
    with pytest.raises(ValueError, match=match):
        kernels.attention_forward(x, x, x, backend="cuda", **kw)


@pytest.mark.parametrize(
    "value, expected", [("triton", "triton"), ("cuda", "cuda"), (" CUDA ", "cuda"), ("auto", None)]
)
def test_backend_env_var_forces_a_backend(monkeypatch, value, expected):
    monkeypatch.setenv(kernels.BACKEND_ENV, value)
    if expected is None:  # auto: the CUDA kernel where it runs, else Triton
        expected = "cuda" if kernels.backend_available("cuda") else "triton"
    assert kernels.select_backend() == expected
    q = torch.zeros(1, 4, 1, 64)
    assert kernels.choose_backend(q, q, q, recipe="current") == expected


def test_backend_env_var_rejects_unknown_names(monkeypatch):
    monkeypatch.setenv(kernels.BACKEND_ENV, "cudnn")
    with pytest.raises(ValueError, match="NVTE_FP8_DPA_MASK_EXACT_BACKEND must be one of"):
        kernels.select_backend()


def test_cuda_unsupported_reason_names_what_it_does_not_run():
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.cuda import attention

    q = torch.zeros(1, 4, 1, 128, dtype=torch.bfloat16)

    def leaky(dtype=torch.bfloat16, d=128, **kw):  # the leaky variant on s = 128 CPU tensors
        x = torch.zeros(1, 128, 1, d, dtype=dtype)
        return attention.unsupported_reason(x, x, x, recipe="current", fp8_v_everywhere=True, **kw)

    reasons = {
        "recipe": attention.unsupported_reason(q, q, q, recipe="mxfp8"),
        "dtype": attention.unsupported_reason(q.float(), q.float(), q.float(), recipe="current"),
        "mixed": attention.unsupported_reason(q, q.half(), q, recipe="current"),
        "leaky fp16": leaky(dtype=torch.half),
        "leaky padding": leaky(attn_mask_type="padding_causal"),
        "leaky window": leaky(window_size=(64, 0)),
        "leaky d = 64": leaky(d=64),
        "leaky right window": leaky(attn_mask_type="no_mask", window_size=(-1, 0)),
        "thd without cu_seqlens": attention.unsupported_reason(
            q[0], q[0], q[0], recipe="current", qkv_format="thd"
        ),
        "thd 4-d": attention.unsupported_reason(
            q, q, q, recipe="current", qkv_format="thd", cu_seqlens_q=1, cu_seqlens_kv=1
        ),
    }
    assert "recipe 'mxfp8'" in reasons["recipe"]
    assert "bf16 or fp16, all three alike" in reasons["dtype"]
    assert "bf16 or fp16, all three alike" in reasons["mixed"]
    assert "leaky variant" in reasons["leaky fp16"] and "bf16 only" in reasons["leaky fp16"]
    assert "leaky variant" in reasons["leaky padding"] and "padding" in reasons["leaky padding"]
    assert "leaky variant" in reasons["leaky window"] and "window" in reasons["leaky window"]
    assert "window" in reasons["leaky right window"]
    assert "d = 64 (128 only)" in reasons["leaky d = 64"]
    causal_leaky = leaky(window_size=(-1, 0))
    # causal's own window: the leaky variant runs it (this CPU tensor fails the device check)
    assert "sm90 GPU" in causal_leaky
    assert "thd needs cu_seqlens_q and cu_seqlens_kv" in reasons["thd without cu_seqlens"]
    assert "thd needs 3-d q, k, v" in reasons["thd 4-d"]
    # The kernel's formats, masks, windows, sequences and dtypes: these CPU tensors fail the
    # device check, not one of theirs.
    cu = torch.tensor([0, 4], dtype=torch.int32)
    kernel_calls = {
        "sbhd": dict(qkv_format="sbhd"),
        "padding": dict(attn_mask_type="padding"),
        "padding_causal_bottom_right": dict(attn_mask_type="padding_causal_bottom_right"),
        "window": dict(attn_mask_type="causal", window_size=(64, 0)),
        "two-sided window": dict(attn_mask_type="no_mask", window_size=(64, 3)),
        "cu_seqlens": dict(attn_mask_type="padding_causal", cu_seqlens_q=cu, cu_seqlens_kv=cu),
        "fp16": dict(),
        "d = 64": dict(),
    }
    for name, kw in kernel_calls.items():
        x = q.half() if name == "fp16" else (q[..., :64] if name == "d = 64" else q)
        reason = attention.unsupported_reason(x, x, x, recipe="current", **kw)
        assert "sm90 GPU" in reason, (name, reason)
    thd = attention.unsupported_reason(
        q[0], q[0], q[0], recipe="current", qkv_format="thd", attn_mask_type="padding_causal",
        cu_seqlens_q=cu, cu_seqlens_kv=cu,
    )  # fmt: skip
    assert "sm90 GPU" in thd, thd
    kv = attention.unsupported_reason(q, q, q, recipe="current", kv_fp8=object())
    assert "argument(s) kv_fp8" in kv


def test_cuda_backward_refuses_what_only_the_forward_runs():
    """Bottom-right causal, padding masks, thd and sliding windows run the CUDA forward and the
    Triton backward: backward_supported says so before any device check."""
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.cuda import backward

    if not backward.extension_has_backward():
        pytest.skip("the extension was built without the sm_90a backward kernels")
    q = torch.zeros(1, 4, 1, 128, dtype=torch.bfloat16)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    refused = {
        "causal_bottom_right": dict(attn_mask_type="causal_bottom_right"),
        "padding": dict(attn_mask_type="padding"),
        "padding_causal": dict(attn_mask_type="padding_causal"),
        "window": dict(attn_mask_type="causal", window_size=(64, 0)),
        "no_mask window": dict(attn_mask_type="no_mask", window_size=(-1, 0)),
    }
    for name, kw in refused.items():
        reason = backward.backward_supported(q, q, q, recipe="current", **kw)
        assert reason is not None and "CUDA backward" in reason, (name, reason)
    thd = backward.backward_supported(
        q[0], q[0], q[0], recipe="current", qkv_format="thd", attn_mask_type="causal",
        cu_seqlens_q=cu, cu_seqlens_kv=cu,
    )  # fmt: skip
    assert "thd" in thd
    d64 = backward.backward_supported(q[..., :64], q[..., :64], q[..., :64], recipe="current")
    assert "d = 128" in d64
    for window in (None, (-1, -1), (-1, 0)):  # no window: the device check speaks
        reason = backward.backward_supported(q, q, q, recipe="current", window_size=window)
        assert "CUDA backward" not in reason and "sm90 GPU" in reason, reason


def test_last_backend_records_the_backend_that_ran(monkeypatch):
    pytest.importorskip("triton", reason="the Triton backend needs Triton")
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton import (
        attention as launcher,
    )

    monkeypatch.setattr(launcher, "exact_fp8_attention_forward", lambda q, k, v, **kw: (q, q))
    q = torch.zeros(1, 2, 1, 64)
    kernels.attention_forward(q, q, q, backend="triton", recipe="current")
    assert kernels.last_backend() == "triton"


def test_bshd_view_is_a_view_and_its_own_inverse():
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import (
        bshd_view,
    )

    bshd = torch.arange(2 * 3 * 4 * 8.0).view(2, 3, 4, 8)
    assert bshd_view(bshd, "bshd") is bshd
    sbhd = bshd.transpose(0, 1).contiguous()
    view = bshd_view(sbhd, "sbhd")
    assert view.data_ptr() == sbhd.data_ptr() and torch.equal(view, bshd)
    assert torch.equal(bshd_view(view, "sbhd"), sbhd)
    with pytest.raises(ValueError, match="bshd or sbhd"):
        bshd_view(bshd.flatten(0, 1), "thd")


def test_cuda_kernel_view_keeps_bshd_and_sbhd_views_and_copies_the_rest():
    """cuda.attention.kernel_view: the CUDA kernel reads V and writes O through batch and
    sequence strides (heads d apart, d contiguous, strides multiples of 8 elements for TMA), so
    a bshd tensor and the bshd view of an sbhd one pass as they are; anything else is copied."""
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.cuda import attention

    bshd = torch.zeros(2, 5, 3, 128, dtype=torch.bfloat16)
    assert attention.kernel_view(bshd) is bshd
    sbhd = torch.zeros(5, 2, 3, 128, dtype=torch.bfloat16).transpose(0, 1)
    assert attention.kernel_view(sbhd) is sbhd
    narrow = torch.zeros(2, 5, 3, 256, dtype=torch.bfloat16)[..., :128]  # heads 256 apart
    copied = attention.kernel_view(narrow)
    assert copied.is_contiguous() and torch.equal(copied, narrow)
