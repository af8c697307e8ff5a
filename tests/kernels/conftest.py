"""Kernel tests run the Triton kernels on CPU through the Triton interpreter.

TRITON_INTERPRET must be set before triton compiles (decorates) any kernel, hence at conftest import.
If something imported our Triton kernel modules earlier without it, the Triton tests skip with a
reason instead of failing on CPU tensors (set it in the top-level tests/conftest.py to be safe).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def triton_ops():
    """The Triton KernelOps, usable on CPU tensors (interpreter), or skip."""
    pytest.importorskip("triton")
    from triton.runtime.interpreter import InterpretedFunction

    from loraplex.kernels import triton_sgmv
    from loraplex.kernels.triton_ops import TRITON_OPS

    if not isinstance(triton_sgmv._sgmv_shrink_kernel, InterpretedFunction):
        pytest.skip("Triton kernels were compiled without TRITON_INTERPRET=1; they cannot run on CPU")
    return TRITON_OPS
