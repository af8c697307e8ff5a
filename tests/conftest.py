"""Shared test set-up. Tiny models are built locally with transformers (never downloaded)."""

from __future__ import annotations

import os

import pytest

# Make CPU thread use predictable on the 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


# Without a GPU, Triton kernels run in the interpreter on CPU tensors. It must be set before the
# first `import triton` anywhere in the session, hence here, at the root.
if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# A test that starts a process, a cluster or a browser through these fixtures is slow whatever its
# module says (modules that start them otherwise carry ``pytestmark = pytest.mark.slow``).
SLOW_FIXTURES = frozenset({"serve_process", "private_postgres", "browser", "page", "signed_in", "cluster"})


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
