"""Torch work that runs off the engine thread runs on a few threads that never exit.

Why (issue 32): an OpenMP runtime keeps state for every thread that enters a parallel region, and
torch enters one for almost any op on a tensor of some size (intra-op parallelism). Intel OpenMP
(the fast runtime, ``runtime_env.py``) makes such a thread a "root" with teams of its own and frees
them when the thread exits. Servers hand blocking work to short-lived threads: anyio's workers, in
which FastAPI runs every sync route, exit after 10 s idle. So each adapter load there made a root and
each idle pause destroyed one; with the ``dist`` barrier pattern the second such exit crashed the
process (libiomp gives a pooled team with no barrier to the next root and frees that NULL barrier
when the root exits: two short-lived threads running one torch op each reproduce it), and with any
runtime every new thread costs a new team and its OpenMP workers.

``run(fn, ...)`` calls ``fn`` on one of ``WORKERS`` threads, started on first use and kept until the
process exits (a ``ThreadPoolExecutor`` worker waits for work forever), and waits for the result:
so the set of threads that ever run torch is fixed. A caller already on a long-lived thread (one of
these, the engine thread, the main thread, or any thread that called ``mark_long_lived``) runs
``fn`` itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
WORKERS = 2  # adapter loads and validations at once; each is one root for OpenMP
THREAD_PREFIX = "loraplex-torch"

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_local = threading.local()


def mark_long_lived() -> None:
    """Declare the calling thread one that lives as long as the process (the engine thread):
    ``run`` called from it runs inline."""
    _local.long_lived = True


def _on_long_lived_thread() -> bool:
    return getattr(_local, "long_lived", False) or threading.current_thread() is threading.main_thread()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                max_workers=WORKERS, thread_name_prefix=THREAD_PREFIX, initializer=mark_long_lived
            )
        return _pool


def run(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a long-lived thread; its result, or its exception re-raised."""
    if _on_long_lived_thread():
        return fn(*args, **kwargs)
    return _executor().submit(fn, *args, **kwargs).result()
