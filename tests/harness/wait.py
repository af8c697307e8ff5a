"""Polling with a generous deadline: how the tests and benchmarks wait for a state, never by sleeping.

A test that sleeps "long enough" is either slow on a quiet machine or flaky on a busy one; a poll
returns as soon as the state holds and fails, with a message saying what it waited for, only when
a deadline far above any plausible wait has passed (on a loaded 2-core machine a server start can
take minutes, so the default is long: a deadline is not a measurement).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from . import HarnessError

T = TypeVar("T")


class WaitTimeout(HarnessError, AssertionError):
    """The state did not come within the deadline (an AssertionError too: pytest shows it as a
    failed expectation, with the message)."""


def wait_for(
    check: Callable[[], T],
    *,
    timeout: float = 120,
    interval: float = 0.05,
    what: str | None = None,
    give_up: Callable[[], str | None] | None = None,
    ignore: tuple[type[BaseException], ...] = (),
    details: Callable[[], str] | None = None,
) -> T:
    """Call ``check`` until it returns something truthy, and return that.

    ``give_up``: called before each check; a message (e.g. "the server exited") fails at once, so a
    process that died is seen immediately instead of at the deadline. ``ignore``: exceptions of
    ``check`` that mean "not yet" (a server that does not accept connections yet). ``details``:
    appended to the timeout message (a log tail, the state seen last)."""
    deadline = time.monotonic() + timeout
    while True:
        if give_up is not None and (reason := give_up()):
            raise HarnessError(f"gave up waiting for {what or 'the condition'}: {reason}")
        try:
            result = check()
        except ignore:
            result = None  # type: ignore[assignment]
        if result:
            return result
        if time.monotonic() >= deadline:
            extra = f"\n{details()}" if details is not None else ""
            raise WaitTimeout(f"timed out after {timeout:.0f} s waiting for {what or 'the condition'}{extra}")
        time.sleep(interval)


async def wait_for_async(
    check: Callable[[], T], *, timeout: float = 120, interval: float = 0.02, what: str | None = None
) -> T:
    """``wait_for`` inside an event loop: sleeps with ``asyncio.sleep``, so the loop (an engine's
    step task, a server) keeps running while the test waits."""
    import asyncio

    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f} s waiting for {what or 'the condition'}")
        await asyncio.sleep(interval)
    return result
