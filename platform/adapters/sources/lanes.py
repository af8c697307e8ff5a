"""Fetches bounded per store: each store (an S3 endpoint or bucket, the file roots, the hub) gets a
lane of at most ``per_store`` running fetches and ``queued_per_store`` waiting ones; one more is
refused at once (503 ``source_busy``) instead of queueing behind a store that is slow or dead. So
a dead store holds at most ``per_store`` fetch threads, until their deadline, and never delays
another store's fetches or anything else. Requests for the same adapter join its one fetch."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from loraplex.platform.adapters.sources.fetchers import StoreUnavailable

T = TypeVar("T")


class StoreBusy(StoreUnavailable):
    code = "source_busy"


@dataclass
class _Lane:
    running: int = 0
    waiting: deque = field(default_factory=deque)  # (key, job, future) not started yet


class StoreLanes(Generic[T]):
    def __init__(self, per_store: int, queued_per_store: int, max_threads: int) -> None:
        self.per_store = per_store
        self.queued_per_store = queued_per_store
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="adapter-fetch")
        self._lock = threading.Lock()
        self._lanes: dict[str, _Lane] = {}
        self._inflight: dict[Hashable, Future[T]] = {}
        self.counters = {"joined": 0, "refused_busy": 0}

    def submit(self, store: str, key: Hashable, job: Callable[[], T]) -> Future[T]:
        """The future of ``job`` (or of the same ``key``'s fetch already queued or running)."""
        with self._lock:
            fut = self._inflight.get(key)
            if fut is not None:
                self.counters["joined"] += 1
                return fut
            lane = self._lanes.setdefault(store, _Lane())
            if lane.running >= self.per_store and len(lane.waiting) >= self.queued_per_store:
                self.counters["refused_busy"] += 1
                raise StoreBusy(
                    f"the store {store.partition(':')[2] or store} has {lane.running} fetches running and "
                    f"{len(lane.waiting)} waiting (it is slow or down); try again later",
                    headers={"retry-after": "10"},
                )
            fut = Future()
            self._inflight[key] = fut
            if lane.running < self.per_store:
                lane.running += 1
                self._start(store, key, job, fut)
            else:
                lane.waiting.append((key, job, fut))
            return fut

    def _start(self, store: str, key: Hashable, job: Callable[[], T], fut: Future[T]) -> None:
        self._pool.submit(self._run, store, key, job, fut)

    def _run(self, store: str, key: Hashable, job: Callable[[], T], fut: Future[T]) -> None:
        try:
            result = job()
        except BaseException as exc:  # noqa: BLE001 - every waiter gets the error
            self._finish(store, key)
            fut.set_exception(exc)
        else:
            self._finish(store, key)
            fut.set_result(result)

    def _finish(self, store: str, key: Hashable) -> None:
        """Before the future resolves: a waiter woken by it and asking again starts a new fetch."""
        with self._lock:
            self._inflight.pop(key, None)
            lane = self._lanes[store]
            if lane.waiting:
                self._start(store, *lane.waiting.popleft())
            else:
                lane.running -= 1
                if lane.running == 0:
                    del self._lanes[store]

    def stats(self) -> dict:
        with self._lock:
            lanes = {s: {"running": ln.running, "waiting": len(ln.waiting)} for s, ln in self._lanes.items()}
        return {**self.counters, "stores": lanes}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
