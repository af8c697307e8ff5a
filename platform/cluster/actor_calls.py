"""Calls to the control-plane actor that ride out its restart: retried with backoff while Ray
restarts it (``max_restarts``), a 503 only when it stays away longer than the retry budget.

``call_actor`` blocks (the background poller, admin calls); ``call_actor_async`` is the same
awaited on an event loop (the request path: ``ActorLoop`` below runs it for callers in worker
threads, so no request thread sits in ``ray.get``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from loraplex.platform.errors import ServiceUnavailable

T = TypeVar("T")

CALL_TIMEOUT_S = 5.0  # one wait; a slow answer is waited for again, never sent twice
RETRY_BUDGET_S = 60.0  # a restart of the actor (a new worker process) on a busy 2-core box, with margin


def call_actor(submit: Callable[[], object], *, what: str = "the cluster control plane") -> object:
    """``ray.get(submit())`` that rides out a restart of the actor. A call that is only slow is
    waited for (a second copy could hold a second reservation); a call that failed because the
    instance died is made again (``submit`` makes a fresh call), with backoff. Blocking: call it
    from a worker thread, never on an event loop."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    deadline = time.monotonic() + RETRY_BUDGET_S
    delay = 0.1
    ref = submit()
    while True:
        left = deadline - time.monotonic()
        try:
            return ray.get(ref, timeout=max(0.1, min(CALL_TIMEOUT_S, left)))  # type: ignore[call-overload]
        except GetTimeoutError:
            if time.monotonic() < deadline:
                continue
            _cancel(ref)
            raise _unavailable(what, f"did not answer in {RETRY_BUDGET_S:.0f} s") from None
        except RayActorError as exc:  # died (or unreachable) before answering: ask the next instance
            if time.monotonic() + delay > deadline:
                raise _unavailable(what, f"is unavailable: {type(exc).__name__}") from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            ref = submit()


async def call_actor_async(
    submit: Callable[[], Any], *, what: str = "the cluster control plane", budget_s: float = RETRY_BUDGET_S
) -> Any:
    """``call_actor`` awaited: the same waits and retries, on the running event loop, for at most
    ``budget_s`` (the caller's own budget, e.g. ``ActorQuotaStore(retry_budget_s=...)``)."""
    from ray.exceptions import RayActorError

    deadline = time.monotonic() + budget_s
    delay = 0.1
    ref = submit()
    answer = asyncio.wrap_future(ref.future())
    while True:
        try:
            return await asyncio.wait_for(asyncio.shield(answer), timeout=max(0.1, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            _cancel(ref)
            raise _unavailable(what, f"did not answer in {budget_s:.0f} s") from None
        except RayActorError as exc:
            if time.monotonic() + delay > deadline:
                raise _unavailable(what, f"is unavailable: {type(exc).__name__}") from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
            ref = submit()
            answer = asyncio.wrap_future(ref.future())


class ActorLoop:
    """An event loop in a daemon thread of its own, for actor calls made on behalf of callers
    that block (the admission code runs in Starlette's worker threads): they wait on a plain
    future while the loop awaits Ray, and the loop can gather many callers into one call."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the loop and wait for its result (from any thread but the loop's)."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise

    def spawn(self, coro: Awaitable[Any]) -> None:
        asyncio.run_coroutine_threadsafe(_await(coro), self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


async def _await(aw: Awaitable[Any]) -> Any:
    return await aw


def _unavailable(what: str, why: str) -> ServiceUnavailable:
    return ServiceUnavailable(f"{what} {why}", headers={"retry-after": "5"})


def _cancel(ref: object) -> None:
    import ray

    try:
        ray.cancel(ref)
    except Exception:  # noqa: BLE001 - already running or done: nothing more to do
        pass
