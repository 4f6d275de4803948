"""The host-time caches of the forward path: what they are keyed on, that a key seen before means
the same result, and that they are bypassed while a CUDA graph is being captured where they
would allocate.

  * triton/launch.py: specialization_key against Triton's own specialization, and
    CompiledLauncher's hit / miss / bypass logic with a stand-in JIT function;
  * sequences.py: the dense Sequences cache (keyed per shape and device, bypassed under
    capture);
  * quantize.py: the dense V-cast sizes against their uncached computation;
  * cuda/attention.py: the one-call forward's workspace layout (per shape) and its dense V
    offsets (keyed per shape and device, bypassed under capture);
  * kernels.device_capability and te/backend's device support, cached per device.
"""

import pytest
import torch

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import (
    kernels,
    quantize,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.te import backend

# ---------------------------------------------------------------------------------------------
# Triton's launch cache


@pytest.fixture
def launch():
    pytest.importorskip("triton")
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.triton import (
        launch as module,
    )

    return module


def _args_zoo():
    from triton.tools.tensor_descriptor import TensorDescriptor

    base = torch.empty(64, 32, dtype=torch.float8_e4m3fn)
    flat = torch.empty(256, dtype=torch.bfloat16)
    return [
        base, base[1:], flat, flat[1:], flat[8:], flat.float(), torch.empty(3, dtype=torch.int32),
        0, 1, 2, 15, 16, 17, 32, -16, 2**31 - 16, 2**31, 2**40 + 1, 1.0, 0.0, 2.5, True, False,
        None, TensorDescriptor.from_tensor(base, [16, 32]),
        TensorDescriptor.from_tensor(base, [32, 32]),
    ]  # fmt: skip


def test_specialization_key_is_never_coarser_than_triton(launch):
    """Arguments with equal keys get Triton's equal specialization, with and without the
    specialization Triton may skip per argument (do_not_specialize)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    zoo = _args_zoo()
    for specialize in (True, False):
        seen = {}
        for arg in zoo:
            spec = native_specialize_impl(BaseBackend, arg, False, specialize, True)
            key = launch.specialization_key([arg])
            assert seen.setdefault(key, spec) == spec, (arg, key, spec)
    # and the key distinguishes what the specialization does
    keys = [launch.specialization_key([a]) for a in zoo]
    assert keys[2] != keys[3] and keys[2] == keys[4]  # an address off the 16-byte grid
    assert launch.specialization_key([1]) != launch.specialization_key([True])
    assert launch.specialization_key([0]) != launch.specialization_key([0.0])


class _FakeKernel:
    function = "function"
    packed_metadata = "packed"

    def __init__(self):
        self.runs = []

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, *args):
        self.runs.append(args)


class _FakeJit:
    """The JITFunction attributes CompiledLauncher reads; fn[grid](...) records the call."""

    arg_names = ["X", "n", "scale", "BLOCK"]

    def __init__(self):
        self.device_caches = {}
        self.pre_run_hooks = []
        self.used_global_vals = {}
        self.jit_calls = []
        self.kernel = _FakeKernel()

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.jit_calls.append((grid, args, kwargs))
            return self.kernel

        return call


@pytest.fixture
def fake_launcher(launch, monkeypatch):
    monkeypatch.setattr(launch, "_get_raw_stream", lambda device: 1000 + device)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    jit = _FakeJit()
    launcher = launch.CompiledLauncher(jit, maxsize=2)
    assert launcher.direct
    return jit, launcher


def test_compiled_launcher_hits_after_the_first_call(fake_launcher, monkeypatch):
    jit, launcher = fake_launcher
    x = torch.empty(64)
    opts = dict(num_warps=4)
    launcher((2, 3), (x, 128, 0.5), dict(BLOCK=64), opts)
    assert len(jit.jit_calls) == 1 and jit.kernel.runs == []
    # a hit: the compiled kernel, the JIT's launch arguments (constexprs last), no allocation
    for name in ("empty", "zeros", "full", "tensor", "arange"):
        monkeypatch.setattr(torch, name, _refuse)
    launcher((2, 3), (x, 128, 0.5), dict(BLOCK=64), opts)
    assert len(jit.jit_calls) == 1
    (run,) = jit.kernel.runs
    assert run[:7] == (2, 3, 1, 1000, "function", "packed", None)
    assert run[9:] == (x, 128, 0.5, 64)


def _refuse(*args, **kwargs):
    raise AssertionError("the cached launch allocated a tensor")


@pytest.mark.parametrize(
    "change",
    [
        dict(args=(torch.empty(64)[1:], 128, 0.5)),  # address off the 16-byte grid
        dict(args=(torch.empty(64), 1, 0.5)),  # an int Triton specializes on (== 1)
        dict(args=(torch.empty(64), 129, 0.5)),  # another value
        dict(args=(torch.empty(64, dtype=torch.bfloat16), 128, 0.5)),  # dtype
        dict(constexprs=dict(BLOCK=128)),
        dict(options=dict(num_warps=8)),
        dict(device=1),
    ],
)
def test_compiled_launcher_key(fake_launcher, monkeypatch, change):
    jit, launcher = fake_launcher
    call = dict(args=(torch.empty(64), 128, 0.5), constexprs=dict(BLOCK=64), options={})
    launcher((1,), call["args"], call["constexprs"], call["options"])
    call.update({k: v for k, v in change.items() if k != "device"})
    if "device" in change:
        monkeypatch.setattr(torch.cuda, "current_device", lambda: change["device"])
    launcher((1,), call["args"], call["constexprs"], call["options"])
    assert len(jit.jit_calls) == 2 and jit.kernel.runs == []  # a new key: through the JIT


def test_compiled_launcher_goes_through_the_jit_when_it_must(fake_launcher, launch, monkeypatch):
    jit, launcher = fake_launcher
    x = torch.empty(64)

    def go():
        launcher((1,), (x, 128, 0.5), dict(BLOCK=64), {})

    go()
    go()
    assert len(jit.jit_calls) == 1
    jit.pre_run_hooks.append(lambda *a, **k: None)  # hooks see every call
    go()
    assert len(jit.jit_calls) == 2
    jit.pre_run_hooks.clear()
    jit.used_global_vals = {("G", None): (1, {"G": 2})}  # a global changed: the JIT raises
    go()
    assert len(jit.jit_calls) == 3
    jit.used_global_vals = {}
    monkeypatch.setattr(launch.knobs.runtime, "debug", True)  # debug kernels are others
    go()
    assert len(jit.jit_calls) == 4
    # the oldest configurations are dropped past maxsize (2), then go through the JIT again
    monkeypatch.setattr(launch.knobs.runtime, "debug", False)
    for n in (1, 2, 3):
        launcher((1,), (x, 128 + n, 0.5), dict(BLOCK=64), {})
    calls = len(jit.jit_calls)
    go()
    assert len(jit.jit_calls) == calls + 1 and launcher.cache_info()["size"] == 2


def test_compiled_launcher_leaves_partial_signatures_and_the_interpreter_to_the_jit(
    fake_launcher, launch
):
    jit, launcher = fake_launcher
    x = torch.empty(64)
    for _ in range(2):  # BLOCK missing (a default): never cached
        launcher((1,), (x, 128, 0.5), {}, {})
    assert len(jit.jit_calls) == 2
    interpreted = _FakeJit()
    del interpreted.device_caches
    launcher = launch.CompiledLauncher(interpreted)
    assert not launcher.direct
    for _ in range(2):
        launcher((1,), (x, 128, 0.5), dict(BLOCK=64), {})
    assert len(interpreted.jit_calls) == 2 and interpreted.kernel.runs == []


# ---------------------------------------------------------------------------------------------
# Dense sequences (sequences.py) and V-cast sizes (quantize)


def test_dense_sequences_cache_is_keyed_per_shape_and_skipped_under_capture(monkeypatch):
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import sequences

    built = []

    def offsets(batch, step, device):
        built.append((batch, step, device))
        return object()

    monkeypatch.setattr(sequences, "dense_offsets", offsets)
    monkeypatch.setattr(
        sequences, "_cached_dense_sequences", sequences.functools.lru_cache(maxsize=64)(
            sequences._build_dense_sequences
        ),
    )  # fmt: skip
    cuda = torch.device("cuda", 0)
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    a = sequences.dense_sequences(2, 128, 256, cuda)
    assert sequences.dense_sequences(2, 128, 256, cuda) is a and len(built) == 2
    assert (a.num_seqs, a.span_q, a.span_kv, a.varlen, a.align_v) == (2, 128, 256, False, False)
    assert sequences.dense_sequences(2, 128, 250, cuda).align_v  # a new shape, aligned V
    assert sequences.dense_sequences(2, 128, 256, torch.device("cuda", 1)) is not a
    n = len(built)
    capturing[0] = True  # a capture builds fresh offsets (filled by the graph's replays)
    c = sequences.dense_sequences(2, 128, 256, cuda)
    assert c is not a and len(built) == n + 2
    assert sequences.dense_sequences(2, 128, 256, cuda) is not c
    capturing[0] = False
    assert sequences.dense_sequences(2, 128, 256, cuda) is a


@pytest.mark.parametrize("chunk", quantize.CHUNK_SIZES)
@pytest.mark.parametrize("aligned", [False, True])
def test_dense_v_cast_sizes_match_the_uncached_computation(chunk, aligned):
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.masks import (
        SeqLayout,
    )

    for batch, seqlen in ((1, 1), (1, 128), (2, 127), (3, 300), (8, 16), (5, 0)):
        seqs = quantize._Sequences(SeqLayout.dense(batch, seqlen), None)
        geo = quantize._Geometry(batch, seqlen, 1, 128, 0, 0, 0)
        want = (quantize._output_width(seqs, geo, aligned), seqs.num_chunks(chunk, geo.tokens))
        assert quantize.dense_transposed_sizes(batch, seqlen, chunk, aligned) == want


# ---------------------------------------------------------------------------------------------
# The CUDA backend's one-call forward: workspace layout and dense V offsets


@pytest.mark.parametrize(
    "shape", [(1, 1, 1, 1, 1), (2, 128, 130, 4, 2), (3, 100, 203, 8, 8), (1, 8192, 8192, 64, 8)]
)
def test_workspace_holds_every_operand_aligned_and_apart(shape):
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.cuda import (
        attention,
    )

    batch, s_q, s_kv, heads, heads_kv = shape
    d = 128
    ws = attention._workspace(batch, s_q, s_kv, heads, heads_kv, d)
    aligned = batch > 1 and s_kv % 16 != 0
    width, chunks = quantize.dense_transposed_sizes(batch, s_kv, 128, aligned)
    assert (ws.vt_width, ws.num_chunks, ws.aligned) == (width, chunks, aligned)
    t_q, t_kv = batch * s_q, batch * s_kv
    need = [  # (offset, bytes) of q8, q_scale, k8, k_scale, v8t, v_scale
        (ws.q8, heads * t_q * d), (ws.q_scale, heads * t_q * 4), (ws.k8, heads_kv * t_kv * d),
        (ws.k_scale, heads_kv * t_kv * 4), (ws.v8t, heads_kv * d * width),
        (ws.v_scale, heads_kv * chunks * 4),
    ]  # fmt: skip
    for (start, size), (next_start, _) in zip(need, need[1:] + [(ws.nbytes, 0)]):
        assert start % 256 == 0 and start + size <= next_start
    assert attention._workspace(batch, s_q, s_kv, heads, heads_kv, d) is ws  # cached


def test_dense_v_offsets_are_cached_per_shape_and_fresh_under_capture(monkeypatch):
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.cuda import (
        attention,
    )

    monkeypatch.setattr(
        attention, "_cached_v_offsets", attention.functools.lru_cache(maxsize=64)(
            attention._v_offsets
        ),
    )  # fmt: skip
    built = []

    def offsets(batch, step, device):
        built.append((batch, step, device))
        return object()

    def columns(batch, seqlen, device, aligned):
        return offsets(batch, -(-seqlen // 32) * 32 if aligned else seqlen, device)

    monkeypatch.setattr(attention, "dense_offsets", offsets)
    monkeypatch.setattr(attention, "dense_column_starts", columns)
    cuda = torch.device("cuda", 0)
    pair = attention._dense_v_offsets(3, 203, cuda, True, False)
    assert built == [(3, 2, cuda), (3, 224, cuda)]  # ceil(203 / 128) chunks, 32-column spans
    assert attention._dense_v_offsets(3, 203, cuda, True, False) is pair and len(built) == 2
    attention._dense_v_offsets(3, 203, cuda, False, False)
    assert built[-1] == (3, 203, cuda) and len(built) == 4
    assert attention._dense_v_offsets(3, 203, torch.device("cuda", 1), True, False) is not pair
    n = len(built)  # a capture builds fresh offsets (filled by the graph's replays)
    assert attention._dense_v_offsets(3, 203, cuda, True, True) is not pair
    assert len(built) == n + 2
    assert attention._dense_v_offsets(3, 203, cuda, True, False) is pair


def test_small_calls_reuse_one_buffer_per_device_stream_and_thread(monkeypatch):
    """_workspace_buffer: a small call gets its (device, stream, thread)'s buffer back, grown
    when a larger small call needs more; a large call and a call under capture get a fresh one."""
    import threading

    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.cuda import (
        attention,
    )

    monkeypatch.setattr(attention, "_small_buffers", {})
    stream = [7]
    monkeypatch.setattr(attention.quantize, "_raw_stream", lambda index: stream[0])
    cpu = torch.device("cpu")  # stands in for the GPU: the logic does not look at the device
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    get = attention._workspace_buffer
    first = get(1000, cpu, False)
    assert first.numel() == 1000 and first.dtype == torch.uint8
    assert get(600, cpu, False) is first  # smaller: the same buffer
    grown = get(5000, cpu, False)
    assert grown is not first and grown.numel() == 5000 and get(1000, cpu, False) is grown
    assert get(1000, cpu, True) is not grown  # under capture: fresh
    big = attention.SMALL_WORKSPACE_BYTES + 1
    assert get(big, cpu, False).numel() == big and get(1000, cpu, False) is grown
    stream[0] = 9  # another stream: its own buffer
    other = get(1000, cpu, False)
    assert other is not grown
    stream[0] = 7
    seen = []
    worker = threading.Thread(target=lambda: seen.append(get(1000, cpu, False)))
    worker.start()
    worker.join()
    assert seen[0] is not grown and get(1000, cpu, False) is grown  # another thread: its own
    assert len(attention._small_buffers) == 3


def test_v_cast_outputs_unchanged_by_the_size_cache():
    """The CPU route (the reference) with the cached sizes: shapes as documented."""
    v = torch.randn(3, 200, 2, 64).bfloat16()
    for aligned in (False, True):
        data_t, scales, cu = quantize.per_chunk_cast_to_fp8_transposed(
            v, qkv_format="bshd", chunk=64, aligned_columns=aligned
        )
        width = 3 * 224 if aligned else 608  # aligned: 200 rounded up to 32 per sample
        assert data_t.shape == (2, 64, width) and scales.shape == (2, 12)
        assert cu.tolist() == [0, 4, 8, 12]


# ---------------------------------------------------------------------------------------------
# Device queries


def test_device_capability_is_cached_per_device(monkeypatch):
    asked = []

    def capability(index):
        asked.append(index)
        return (9, index)

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    kernels._device_capability.cache_clear()
    try:
        assert kernels.device_capability(torch.device("cuda", 1)) == (9, 1)
        assert kernels.device_capability(torch.device("cuda", 1)) == (9, 1)
        assert kernels.device_capability(torch.device("cuda")) == (9, 3)  # the current device
        assert asked == [1, 3]
    finally:
        kernels._device_capability.cache_clear()


def test_device_support_caches_the_static_part_and_asks_onnx_per_call(monkeypatch):
    pytest.importorskip("triton")  # the Triton backend's head dims
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(backend, "_compute_capability", lambda device: (9, 0))
    monkeypatch.setattr(kernels, "backend_available", lambda name: True)
    exporting = [False]
    monkeypatch.setattr(backend, "_onnx_export", lambda: exporting[0])
    backend._static_support.cache_clear()
    try:
        first = backend._device_support()
        assert first == dict(
            compute_capability=(9, 0), head_dims=kernels.head_dims("triton"),
            triton_available=True, extension_available=quantize.extension_available(),
            onnx_export=False,
        )  # fmt: skip
        first["head_dims"] = ()  # a copy: the cached part is not changed through it
        exporting[0] = True
        second = backend._device_support()
        assert second["onnx_export"] and second["head_dims"] != ()
        assert backend._static_support.cache_info().misses == 1
    finally:
        backend._static_support.cache_clear()


def test_qkv_formats_cached_results():
    assert backend.qkv_formats("sbhd_sb2hd") == ("sbhd", "sbhd")
    assert backend.qkv_formats("paged_kv_bshd_bshd_bshd") == ("bshd", "bshd")
    assert backend.qkv_formats("thd_thd_thd") == ("thd", "thd")
    assert backend.qkv_formats.cache_info().hits >= 0  # an lru_cache
