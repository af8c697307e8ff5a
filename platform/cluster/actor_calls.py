"""Calls to the control-plane actor that ride out its restart: retried with backoff while Ray
restarts it (``max_restarts``), a 503 only when it stays away longer than the retry budget."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from loraplex.platform.errors import ServiceUnavailable

T = TypeVar("T")

CALL_TIMEOUT_S = 10.0  # one try: generous, the box may be busy
RETRY_BUDGET_S = 20.0  # a restart of the actor takes a few seconds; this covers it with margin


def call_actor(submit: Callable[[], object], *, what: str = "the cluster control plane") -> object:
    """``ray.get(submit())`` with retries: ``submit`` makes a fresh call each try (an ObjectRef of
    a dead instance never resolves to anything else). Blocking: call from a worker thread."""
    import ray
    from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

    deadline = time.monotonic() + RETRY_BUDGET_S
    delay = 0.1
    while True:
        try:
            return ray.get(submit(), timeout=CALL_TIMEOUT_S)  # type: ignore[call-overload]
        except (RayActorError, ActorUnavailableError, GetTimeoutError) as exc:
            if time.monotonic() + delay > deadline:
                raise ServiceUnavailable(
                    f"{what} is unavailable: {type(exc).__name__}", headers={"retry-after": "5"}
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
