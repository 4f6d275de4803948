"""Launch a @triton.jit kernel through its compiled handle once a configuration has compiled.

    launcher = CompiledLauncher(attention_forward_kernel)
    launcher(grid, args, constexprs, options)   # as attention_forward_kernel[grid](*args, ...)

Triton's JIT binds and specializes every argument and builds a cache key string on each call,
which costs more host time than the launch itself at small shapes. CompiledLauncher keeps the
CompiledKernel that the JIT returned, under a key from which Triton's specialization follows
(`specialization_key`), and launches it directly the way the JIT does (same launch metadata,
enter/exit hooks, current device and stream). A new key goes through the JIT (which compiles
on a miss and caches, as before), so nothing new is compiled here and the first call of a
configuration behaves exactly as before.

CUDA graphs: a hit allocates nothing and never syncs; the stream is the current one (the
capture stream under capture), read per call. Triton's interpreter (TRITON_INTERPRET=1 when the
kernel was defined) has no compiled kernel: calls go to the interpreter unchanged.
"""

import threading
from collections import OrderedDict
from typing import Any, Dict, Sequence, Tuple

import torch
from triton import knobs
from triton.tools.tensor_descriptor import TensorDescriptor

__all__ = ["CompiledLauncher", "specialization_key"]

_TENSOR = torch.Tensor
_DESCRIPTOR = TensorDescriptor
_get_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def specialization_key(args: Sequence[Any]) -> Tuple:
    """A hashable key of the runtime arguments that determines Triton's specialization of them.

    Triton specializes a tensor on its dtype and whether its address is 16-byte aligned, an int
    on its value range and on being 1 or a multiple of 16, a host tensor descriptor on its dtype
    and block shape, everything else on its type. The key holds, per argument, a tensor's dtype
    and address modulo 16, a descriptor's dtype and block shape, and any other argument's type
    and value: finer than the specialization (a key seen before implies the same compiled
    kernel), never coarser."""
    return tuple(
        [
            (
                (a.dtype, a.data_ptr() & 15)
                if type(a) is _TENSOR
                else ((a.base.dtype, *a.block_shape) if type(a) is _DESCRIPTOR else (type(a), a))
            )
            for a in args
        ]
    )


class CompiledLauncher:
    """Calls of one @triton.jit kernel: through the JIT the first time a key is seen, then
    through the compiled kernel it returned. See the module doc.

    maxsize: configurations kept (the oldest dropped first; a dropped one goes through the JIT
    again, which still has it compiled)."""

    def __init__(self, fn, maxsize: int = 64):
        self.fn = fn
        self.maxsize = maxsize
        self._cache: "OrderedDict[Tuple, Tuple[Any, Tuple]]" = OrderedDict()  # insertion order
        self._lock = threading.Lock()
        # Triton's interpreter has no device caches and no compiled kernel to keep.
        self.direct = hasattr(fn, "device_caches") and _get_raw_stream is not None

    def cache_info(self) -> Dict[str, int]:
        return dict(size=len(self._cache), maxsize=self.maxsize)

    def cache_clear(self) -> None:
        with self._lock:
            self._cache.clear()

    def __call__(
        self,
        grid: Tuple[int, ...],
        args: Sequence[Any],
        constexprs: Dict[str, Any],
        options: Dict[str, Any],
    ):
        """As fn[grid](*args, **constexprs, **options): args are the kernel's leading runtime
        arguments in signature order, constexprs its remaining (constexpr) parameters by name,
        options the launch options (num_warps, num_stages, maxnreg, ...)."""
        fn = self.fn
        if not self.direct:
            return fn[grid](*args, **constexprs, **options)
        device = torch.cuda.current_device()
        key = (
            device,
            specialization_key(args),
            tuple(constexprs),
            specialization_key(constexprs.values()),
            tuple(options.items()),
            knobs.runtime.debug,
            knobs.compilation.instrumentation_mode,
        )
        entry = self._cache.get(key)
        if entry is None or fn.pre_run_hooks:
            kernel = fn[grid](*args, **constexprs, **options)
            if kernel is not None and not fn.pre_run_hooks:
                self._insert(key, kernel, args, constexprs)
            return kernel
        kernel, tail = entry
        for (name, _), (val, globals_dict) in fn.used_global_vals.items():
            if globals_dict.get(name, _MISSING) != val:  # as the JIT checks; it raises
                return fn[grid](*args, **constexprs, **options)
        full = (*args, *tail)
        stream = _get_raw_stream(device)
        grid_1 = grid[1] if len(grid) > 1 else 1
        grid_2 = grid[2] if len(grid) > 2 else 1
        kernel.run(
            grid[0], grid_1, grid_2, stream, kernel.function, kernel.packed_metadata,
            kernel.launch_metadata(grid, stream, *full),
            knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *full,
        )  # fmt: skip
        return kernel

    def _insert(self, key, kernel, args, constexprs):
        if hasattr(kernel, "result"):  # an asynchronous compile
            kernel = kernel.result()
        names = self.fn.arg_names
        rest = names[len(args) :]
        if len(args) + len(constexprs) != len(names) or any(n not in constexprs for n in rest):
            return  # not the kernel's full parameter list in order: always through the JIT
        tail = tuple(constexprs[name] for name in rest)
        with self._lock:
            self._cache[key] = (kernel, tail)
            while len(self._cache) > self.maxsize:
                self._cache.popitem(last=False)


_MISSING = object()
