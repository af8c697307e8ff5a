"""Calls to the control-plane actor that ride out its restart: retried with backoff while Ray
restarts it (``max_restarts``), a 503 only when it stays away longer than the retry budget."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from loraplex.platform.errors import ServiceUnavailable

T = TypeVar("T")

CALL_TIMEOUT_S = 5.0  # one wait; a slow answer is waited for again, never sent twice
RETRY_BUDGET_S = 30.0  # a restart of the actor (a new worker process) on a busy box, with margin


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
            raise ServiceUnavailable(
                f"{what} did not answer in {RETRY_BUDGET_S:.0f} s", headers={"retry-after": "5"}
            ) from None
        except RayActorError as exc:  # died (or unreachable) before answering: ask the next instance
            if time.monotonic() + delay > deadline:
                raise ServiceUnavailable(
                    f"{what} is unavailable: {type(exc).__name__}", headers={"retry-after": "5"}
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            ref = submit()


def _cancel(ref: object) -> None:
    import ray

    try:
        ray.cancel(ref)
    except Exception:  # noqa: BLE001 - already running or done: nothing more to do
        pass
