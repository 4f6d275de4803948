"""Numeric helpers shared by the tests, the benchmarks and the causality audit."""

import dataclasses
import statistics
import time
from typing import Callable, Iterable, List, Tuple

import torch

__all__ = [
    "prefix_change", "rel_frobenius_error", "cosine_similarity", "aligned_columns_reference",
    "host_us_per_call", "LEAKY_CP_RULES", "leaky_cp_quantizer", "one_hot_self_scores",
    "HUGE_ROW_SCALES", "negative_score_inputs", "longest_kernel", "gpu_kernel_ms",
]  # fmt: skip


def prefix_change(
    base: torch.Tensor, perturbed: torch.Tensor, protected: torch.Tensor
) -> Tuple[float, int]:
    """(max |difference|, number of elements that differ bitwise) over the protected rows.

    base/perturbed: [t, h, d] token-major outputs; protected: [t] bool. NaN compares as changed.
    """
    a, b = base[protected], perturbed[protected]
    changed = ~((a == b) | (torch.isnan(a) & torch.isnan(b)))
    diff = (a.double() - b.double()).abs()
    max_abs = float(diff.nan_to_num(nan=float("inf")).max()) if diff.numel() else 0.0
    return max_abs, int(changed.sum())


def rel_frobenius_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F in fp64."""
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


# Input scales of one_hot_self_scores and the log2-unit magnitude of the rows' largest score
# (about 16.3 * scale^2 at d = 128): one row under the huge-row threshold (2^16), the others from
# where the one-FMA exponent loses the max's P8 (~2^20) through saturation (2^23) to exp2 overflow
# (~2^31).
HUGE_ROW_SCALES = {8.0: "2^10", 256.0: "2^20", 2896.0: "2^27", 23170.0: "2^33"}


def one_hot_self_scores(
    seed: int, b: int, s: int, h: int, d: int, scale: float, dtype=torch.bfloat16
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(qk, v) on the CPU, bshd [b, s, h, d]: qk = N(0, 1) * scale serves as Q and K, v = N(0, 1).

    Every row's score against its own key, |q_i|^2 * d^-1/2, exceeds its score against any other
    key by ~0.7 of itself (~12 * scale^2 log2 units at d = 128): under a causal mask the softmax is
    one-hot on the diagonal key at every scale >= 8, in any precision, so the output is exactly
    v (the diagonal key is always a boundary key: unquantized V, P = P_SCALE)."""
    gen = torch.Generator().manual_seed(seed)
    qk = (torch.randn(b, s, h, d, generator=gen) * scale).to(dtype)
    v = torch.randn(b, s, h, d, generator=gen).to(dtype)
    return qk, v


def cosine_similarity(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Cosine of the angle between the flattened tensors, in fp64."""
    out, ref = out.double().flatten(), ref.double().flatten()
    return float(out @ ref / (out.norm() * ref.norm()))


def error_metrics(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """{"rmse", "rel_err" (relative Frobenius), "cosine"} of out against ref, in fp64: the
    columns of the accuracy tables."""
    diff = out.double() - ref.double()
    return {
        "rmse": diff.pow(2).mean().sqrt().item(),
        "rel_err": rel_frobenius_error(out, ref),
        "cosine": cosine_similarity(out, ref),
    }


def aligned_columns_reference(
    v8t: torch.Tensor, starts: List[int]
) -> Tuple[torch.Tensor, List[int]]:
    """The aligned layout (vt_layout) of a plain V8^T, built slice by slice: (bytes [h, d, width]
    uint8, each sequence's first column). v8t [h, d, t_pad] FP8 with sequence n in the columns
    [starts[n], starts[n + 1]); each span goes to the next multiple of 32, the rest is 0."""
    spans = [b - a for a, b in zip(starts, starts[1:])]
    cols = [0]
    for span in spans:
        cols.append(cols[-1] + (span + 31) // 32 * 32)
    src = v8t.view(torch.uint8)
    out = torch.zeros(src.shape[:-1] + (cols[-1],), dtype=torch.uint8)
    for n, span in enumerate(spans):
        out[..., cols[n] : cols[n] + span] = src[..., starts[n] : starts[n] + span].cpu()
    return out, cols


def host_us_per_call(fn: Callable[[], object], calls: int = 200, repeats: int = 3) -> float:
    """Host (CPU) microseconds per call of fn, calls issued back to back (median of `repeats`):
    what a call costs where the GPU work is too small to hide it. fn runs once before timing."""
    fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


LEAKY_CP_RULES = ("global-amax", "straddling-chunk")
"""Negative controls of context parallelism's V rule (current scaling), that tests must catch:
"global-amax", one V scale per kv-head over every token of every rank and sample (upstream's
FP8 ring reduces one amax over the group); "straddling-chunk", one V scale per 256 global
tokens, so that a scale straddles two ranks' shards (with 128-token load-balanced chunks)."""


def gpu_ms_per_call(fn: Callable[[], object], warmup: int = 5, calls: int = 25) -> float:
    """Median GPU time of one call of fn in ms: CUDA events around each call, synchronized after
    each (so host time between calls is not counted, the call's own host gaps are)."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(calls):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


SLEEP_CYCLES = 100_000_000
"""Cycles of the sleep kernel that gpu_ms_queued and gpu_ms_after issue before the work they
time: ~50 ms at H100 / H200 clocks, longer than the host takes to enqueue that work."""

L2_FLUSH_BYTES = 256 * 1024 * 1024
"""Bytes that gpu_ms_after writes between a call's preparation and its timed part: more than the
L2 cache of an H100 / H200 (50 / 60 MB), so that the timed part reads its inputs from memory, as
triton's do_bench arranges for its calls."""


def gpu_ms_after(
    prepare: Callable[[], object], fn: Callable[[object], object], warmup: int = 2, calls: int = 10
) -> float:
    """Median GPU time in ms of fn(prepare()) without prepare's part, with the host ahead of the
    GPU as in a training step: each call runs prepare() untimed, clears the L2 cache, then
    queues fn on its result behind a sleep kernel (as gpu_ms_queued does) between CUDA events.
    For work that runs once per preparation: a backward that frees the graph its forward saved."""
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for n in range(warmup + calls):
        prepared = prepare()
        flush.zero_()
        torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        fn(prepared)
        end.record()
        end.synchronize()
        if n >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def gpu_ms_queued(fn: Callable[[], object], warmup: int = 5, calls: int = 10) -> float:
    """GPU time of one call of fn in ms with the host ahead of the GPU, as in a training step:
    `calls` calls queued behind a sleep kernel, so that the GPU runs them back to back, CUDA
    events around them, their mean. The host's time before and between the launches is not
    counted (gpu_ms_per_call counts it); a call whose host time exceeds its GPU time would still
    show it once the sleep has run out."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def negative_score_inputs(
    shape: Tuple[int, int, int, int], negative_rows, seed: int = 0, device: str = "cpu"
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q, K, V [b, s, h, d] bf16 whose scores are all negative in the query rows `negative_rows`
    (an index or an [s] bool mask along s) and of either sign elsewhere: N(0, 1) draws (Q, K, V
    in turn from one generator), Q scaled by 0.3, K's feature 0 shifted by +6 and Q's feature 0
    set to -8 in those rows, so that there q . k ~ N(-48, 8.7^2), positive about once in 10^8.
    Rows that stay negative take the sm90 forward's fallback for the row maxima (softmax.h, Note
    [Row maxima from the scores' bits]): the tests' and the score-sign benchmark's inputs."""
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(shape, generator=gen, device=device) for _ in range(3))
    q *= 0.3
    k[..., 0] += 6.0
    q[:, negative_rows, :, 0] = -8.0
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def longest_kernel(kernels: Iterable[Tuple[str, float]], calls: int) -> Tuple[str, float]:
    """The kernel name with the most device time among (name, microseconds) records of `calls`
    calls, and its milliseconds per call: a library call's attention kernel apart from the casts
    and copies launched around it."""
    totals = {}
    for name, us in kernels:
        totals[name] = totals.get(name, 0.0) + us
    if not totals:
        raise ValueError("no GPU kernel was recorded")
    name = max(totals, key=totals.get)
    return name, totals[name] / calls / 1e3


def gpu_kernel_ms(fn: Callable[[], object], warmup: int = 3, calls: int = 10) -> Tuple[str, float]:
    """fn's longest GPU kernel (longest_kernel) and its ms per call, from the kernel durations
    the CUDA profiler records (torch.profiler) over `calls` calls: the time of a library's
    attention kernel alone when it can only be called with its casts (TE's DelayedScaling)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    records = [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == cuda]
    return longest_kernel(records, calls)


def leaky_cp_quantizer(rule: str, v_global: torch.Tensor, cp_size: int, qkv_format: str):
    """A payload builder for context_parallel.simulate's `quantize` whose V scales follow the
    leaky `rule` (LEAKY_CP_RULES) over the global V [b, s, h_kv, d] (bshd) or [s, b, ...]; K and
    everything else as payload.quantize_kv."""
    from .context_parallel.chunking import check_seqlen, local_positions
    from .context_parallel.payload import quantize_kv
    from .formats import V_CHUNK_CURRENT, cast_to_e4m3, compute_scale_from_amax
    from .masks import SeqLayout, to_tokens

    if rule not in LEAKY_CP_RULES:
        raise ValueError(f"rule must be one of {LEAKY_CP_RULES}, got {rule!r}")
    vg = v_global if qkv_format == "bshd" else v_global.transpose(0, 1)  # [b, s, h_kv, d]
    batch, seqlen = vg.shape[:2]
    chunk_len = check_seqlen(seqlen, cp_size)
    amax_g = vg.detach().float().abs().cpu()

    def quantize(k, v, *, rank, recipe, **kwargs):
        payload = quantize_kv(k, v, rank=rank, recipe=recipe, **kwargs)
        if recipe != "current":
            raise ValueError("the leaky controls are current-scaling rules")
        pos = local_positions(rank, cp_size, chunk_len)  # global position of each local token
        n_local = pos.numel() // V_CHUNK_CURRENT
        amax = torch.empty(batch, n_local, vg.shape[2])
        for n in range(batch):
            for c in range(n_local):
                if rule == "global-amax":
                    amax[n, c] = amax_g.amax(dim=(0, 1, 3))
                else:
                    pair = int(pos[c * V_CHUNK_CURRENT]) // (2 * V_CHUNK_CURRENT)
                    cols = slice(pair * 2 * V_CHUNK_CURRENT, (pair + 1) * 2 * V_CHUNK_CURRENT)
                    amax[n, c] = amax_g[n, cols].amax(dim=(0, 2))
        scale = compute_scale_from_amax(amax.flatten(0, 1))  # [n_chunks, h_kv]
        ids, _ = SeqLayout.dense(batch, pos.numel()).chunk_ids(V_CHUNK_CURRENT)
        v_t = to_tokens(v.detach().cpu(), kwargs.get("qkv_format", "bshd")).float()
        data = cast_to_e4m3(v_t * scale[ids].unsqueeze(-1))  # [t, h_kv, d]
        v8t = data.permute(1, 2, 0).contiguous().to(v.device)
        scale_inv = (1.0 / scale).t().contiguous().to(v.device)
        return dataclasses.replace(payload, v_fp8=(v8t, scale_inv) + payload.v_fp8[2:])

    return quantize
