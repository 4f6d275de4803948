"""Shared by the Triton interpreter tests (test_*_interpreter.py): run a test module's cases in a
child pytest process with TRITON_INTERPRET=1, and the NumPy 2.4 fix of Triton 3.6's interpreter.

Triton chooses the interpreter when a kernel is defined, so the cases run in a child process
(another test module of the same pytest run may hold the compiled kernels).
"""

import os
import subprocess
import sys

import numpy as np
import pytest


def run_under_interpreter(test_file: str, timeout: int = 1800) -> None:
    """Run `test_file`'s cases in a child pytest with TRITON_INTERPRET=1; fail with its output."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-4000:]


def index_scalars_with_numpy_2_4() -> None:
    """Triton 3.6's interpreter takes int() of 1-element arrays for loop bounds; NumPy 2.4
    turned that long-deprecated conversion into an error. Read the one element instead."""
    if tuple(int(x) for x in np.__version__.split(".")[:2]) < (2, 4):
        return
    import triton.runtime.interpreter as triton_interpreter

    patch_tensor = triton_interpreter._patch_lang_tensor
    if getattr(patch_tensor, "_reads_one_element", False):
        return

    def patched(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._reads_one_element = True
    triton_interpreter._patch_lang_tensor = patched
