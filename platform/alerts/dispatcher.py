"""Delivers the outbox: a thread of the server process that, every ``dispatch_interval_s``, fans
new events out to the matching webhooks, claims due deliveries under a lease, POSTs them signed
(``signing.py``) and records each outcome.

The deliveries of a pass run concurrently (at most ``batch_size``), each under one deadline for the
whole exchange (``delivery_timeout_s``: connect, send, headers and body together), so a receiver
that sleeps or trickles its answer a byte at a time costs only its own delivery that long: it never
holds the others (the hostile round: a trickling receiver held the one dispatcher thread forever).

Delivery is at least once: a server killed after the receiver answered but before the outcome was
written delivers the row again once the lease expires, under the same ``webhook-id`` (receivers
dedupe by it, as Standard Webhooks asks). An outcome is never lost the other way: a row leaves
``pending`` only by a 2xx (``delivered``) or by running out of attempts (``dead``)."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
import uuid
from datetime import datetime, timedelta

import httpx
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.alerts import repository, signing
from loraplex.platform.alerts.outbox import Outbox
from loraplex.platform.alerts.urls import Resolver, UnsafeUrl, pinned_target, system_resolver
from loraplex.platform.db.base import utcnow
from loraplex.platform.settings import AlertSettings

log = logging.getLogger("loraplex.platform.alerts")
_SWEEP_BATCH = 500  # rows per transaction
_SWEEP_MAX_BATCHES = 100  # per sweep; the rest waits for the next one


def backoff_s(attempt: int, settings: AlertSettings, rand: random.Random | None = None) -> float:
    """Wait after the ``attempt``-th failure: exponential, capped, half of it random (jitter), so
    receivers coming back are not hit by every server's retries in the same second."""
    full = min(settings.backoff_max_s, settings.backoff_base_s * 2 ** max(0, attempt - 1))
    return full / 2 + (rand or random).uniform(0, full / 2)


class Dispatcher:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        outbox: Outbox,
        settings: AlertSettings,
        resolver: Resolver = system_resolver,
    ) -> None:
        self._sessions = sessions
        self._outbox = outbox
        self._settings = settings
        self._resolver = resolver
        self.owner = f"{uuid.uuid4().hex[:16]}"  # this process's lease name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_sweep: float | None = None  # monotonic; None: sweep on the first pass

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="loraplex-alerts", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self._settings.dispatch_interval_s):
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 - database down etc.: the next pass retries
                # once per outage, not once per pass
                (log.debug if failing else log.warning)(
                    "alerts: dispatch pass failed (retrying every pass): %s",
                    (str(exc).splitlines() or [repr(exc)])[0][:200],
                )
                failing = True
                continue
            if failing:
                log.warning("alerts: dispatching again")
            failing = False
            self._maybe_sweep()

    def _maybe_sweep(self) -> None:
        s = self._settings
        now = time.monotonic()
        if s.retention_days <= 0 or (self._last_sweep is not None and now - self._last_sweep < s.sweep_interval_s):
            return
        self._last_sweep = now  # a failed sweep waits for the next interval too (it logs)
        try:
            self.sweep_once()
        except Exception as exc:  # noqa: BLE001 - database down: the next interval retries
            log.warning("alerts: retention sweep failed: %s", (str(exc).splitlines() or [repr(exc)])[0][:200])

    def sweep_once(self, now: datetime | None = None) -> tuple[int, int]:
        """Delete finished deliveries and closed-window events older than ``alerts.retention_days``
        (repository.sweep), a batch per transaction so no lock is held long; returns the counts."""
        now = now or utcnow()
        cutoff = now - timedelta(days=self._settings.retention_days)
        total = [0, 0]
        for _ in range(_SWEEP_MAX_BATCHES):
            with self._sessions() as session:
                got = repository.sweep(session, cutoff, now, _SWEEP_BATCH)
                session.commit()
            total = [total[0] + got[0], total[1] + got[1]]
            if max(got) < _SWEEP_BATCH:
                break
        if any(total):
            log.info("alerts: retention swept %d deliveries and %d events", *total)
        return total[0], total[1]

    def run_once(self) -> int:
        """One pass; returns how many deliveries were attempted."""
        s = self._settings
        self._outbox.retry_pending()
        with self._sessions() as session:
            if not repository.work_waiting(session, utcnow()):
                return 0
        with self._sessions() as session:
            repository.fan_out(session, utcnow(), s.batch_size, s.max_fanout_per_event)
            session.commit()
        with self._sessions() as session:
            ids = repository.claim(session, self.owner, utcnow(), s.lease_s, s.batch_size)
            session.commit()
        if not ids:
            return 0
        with self._sessions() as session:
            work = [(d.id, d.attempts, e.id, e.body, w.url, w.secret) for d, e, w in repository.claimed(session, ids)]
        asyncio.run(self._deliver_all(work))
        return len(work)

    async def _deliver_all(self, work: list[tuple[int, int, str, str, str, str]]) -> None:
        async with httpx.AsyncClient(timeout=self._settings.delivery_timeout_s, follow_redirects=False) as client:
            outcomes = await asyncio.gather(*(self._deliver_one(client, *w) for w in work), return_exceptions=True)
        failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failed is not None:  # e.g. the database went away while recording: the pass logs it
            raise failed

    async def _deliver_one(
        self,
        client: httpx.AsyncClient,
        delivery_id: int,
        attempts: int,
        event_id: str,
        body: str,
        url: str,
        secret: str,
    ) -> None:
        if self._stop.is_set():
            return  # the lease expires; another pass (or server) delivers it
        deadline = self._settings.delivery_timeout_s
        try:
            ok, status, error = await asyncio.wait_for(self._post(client, url, secret, event_id, body), deadline)
        except TimeoutError:
            ok, status, error = False, None, f"no whole answer within delivery_timeout_s ({deadline:g} s)"
        except Exception as exc:  # noqa: BLE001 - e.g. a stored secret that cannot sign: a failed
            # attempt (retried, then dead), never an exception that leaves the row pending forever
            ok, status, error = False, None, f"{type(exc).__name__}: {exc}"[:500]
        await asyncio.to_thread(self._record, delivery_id, attempts, ok, status, error)

    async def _post(
        self, client: httpx.AsyncClient, url: str, secret: str, event_id: str, body: str
    ) -> tuple[bool, int | None, str | None]:
        try:  # resolves the host once (off the loop), checks, and pins the address checked
            target = await asyncio.to_thread(pinned_target, url, self._settings, self._resolver)
        except UnsafeUrl as exc:
            return False, None, exc.message[:500]
        headers = signing.headers(secret, event_id, int(time.time()), body) | {"host": target.host_header}
        try:  # to the pinned address: the connection never resolves the name again (DNS rebinding)
            resp = await client.post(
                target.url,
                content=body.encode(),
                headers=headers,
                extensions={"sni_hostname": target.sni_hostname} if target.sni_hostname else None,
            )
        except httpx.HTTPError as exc:
            return False, None, f"{type(exc).__name__}: {exc}"[:500]
        if 200 <= resp.status_code < 300:
            return True, resp.status_code, None
        return False, resp.status_code, f"HTTP {resp.status_code}"

    def _record(self, delivery_id: int, attempts: int, ok: bool, status: int | None, error: str | None) -> None:
        now = utcnow()
        retry_at: datetime | None = None
        if not ok and attempts < self._settings.max_attempts:
            retry_at = now + timedelta(seconds=backoff_s(attempts, self._settings))
        with self._sessions() as session:
            repository.finish(
                session, delivery_id, self.owner, ok=ok, now=now, status=status, error=error, retry_at=retry_at
            )
            session.commit()
