"""The driver's drain on SIGTERM/SIGINT (``loraplex serve --replicas N``): the one-process contract
on Ray. New requests are refused with 503 (every ingress reads ``draining`` at its next tick),
requests in flight run to their end, then the deployments go.

What "in flight" means is asked twice, because either answer alone can be wrong:
- the control plane's live reservations (an admitted request holds one until it is settled);
- the in-flight counts the ingresses report at each tick (a request is counted from its submit
  to its end).

The drain ends when no reservation is left, or when every ingress has reported nothing in flight
for ``quiet_s`` while reservations remain: those are held by no request, and waiting for them
would only wait out ``timeout_s`` (a CI run saw a driver still draining 240 s after its last
stream ended). They are named in the log, so a leak shows where it comes from.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loraplex.platform.cluster.messages import DrainProgress

log = logging.getLogger("loraplex.platform.cluster")


@dataclass(frozen=True)
class DrainVerdict:
    done: bool
    orphans: int = 0  # reservations left that no request in flight holds


class DrainWatch:
    """Decides from successive ``DrainProgress`` readings when the drain is over (pure: the clock
    is passed in, so the tests drive it)."""

    def __init__(self, quiet_s: float) -> None:
        self._quiet_s = quiet_s
        self._quiet_since: float | None = None

    def see(self, progress: DrainProgress, now: float) -> DrainVerdict:
        if progress.reservations == 0:
            return DrainVerdict(True)
        if progress.in_flight > 0 or progress.ingresses == 0:
            # something still runs, or no ingress reported: nothing says the holds are orphans
            self._quiet_since = None
            return DrainVerdict(False)
        if self._quiet_since is None:
            self._quiet_since = now
        if now - self._quiet_since >= self._quiet_s:
            return DrainVerdict(True, orphans=progress.reservations)
        return DrainVerdict(False)


def drain(
    control: Any,
    timeout_s: float,
    tick_s: float,
    *,
    say: Callable[[str], None] = lambda line: print(line, flush=True),
) -> int:
    """Refuse new requests, wait for the ones in flight (at most ``timeout_s``). Returns how many
    were still running when it gave up (orphaned reservations do not count: nothing runs)."""
    import ray

    say("loraplex: draining (new requests get 503; in-flight requests finish)")
    started = time.monotonic()
    deadline = started + timeout_s
    ray.get(control.set_draining.remote(True), timeout=30)
    while time.monotonic() < deadline:  # every ingress refuses new requests from here on
        try:
            if ray.get(control.drain_acknowledged.remote(), timeout=10):
                break
        except Exception as exc:  # noqa: BLE001 - the control plane restarting: ask again
            log.warning("drain: %s", exc)
        time.sleep(tick_s)
    say(f"loraplex: drain: every ingress refuses new requests ({time.monotonic() - started:.1f} s)")
    # three ingress ticks with nothing in flight (a tick reports the count it had at that moment)
    watch = DrainWatch(quiet_s=max(3 * tick_s, 2.0))
    left = -1  # unknown until the control plane answers
    said_at = time.monotonic()
    while time.monotonic() < deadline:
        try:
            progress: DrainProgress = ray.get(control.drain_progress.remote(), timeout=10)
        except Exception as exc:  # noqa: BLE001 - the control plane restarting: ask again
            log.warning("drain: %s", exc)
            time.sleep(0.2)
            continue
        verdict = watch.see(progress, time.monotonic())
        if verdict.done:
            left = 0
            if verdict.orphans:
                say(
                    f"loraplex: drain: {verdict.orphans} reservation(s) held by no request in flight "
                    f"(by owner: {progress.by_owner}): not waited for"
                )
            break
        left = max(progress.in_flight, progress.reservations)
        if time.monotonic() - said_at >= 10:
            said_at = time.monotonic()
            say(
                f"loraplex: drain: waiting for {progress.in_flight} request(s) in flight, "
                f"{progress.reservations} reservation(s) ({time.monotonic() - started:.0f} s)"
            )
        time.sleep(0.2)
    time.sleep(1.0)  # settled just before the last bytes: let them leave the ingress
    left = max(left, 0)
    say(f"loraplex: drained ({left} request(s) still running at the end, {time.monotonic() - started:.1f} s)")
    return left
