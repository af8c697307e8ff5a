"""Admission shared by every server on one database, made atomic across them.

A tenant with an rpm, tpm or budget limit is admitted in one short database transaction:

1. take the tenant's lock: on PostgreSQL a transaction-scoped advisory lock
   (``pg_advisory_xact_lock``) on the tenant id; on SQLite the database's write lock (a write
   transaction, ``BEGIN IMMEDIATE`` semantics: one writer per file);
2. read what the other servers admitted (``repository.others_usage``);
3. the caller checks its limits against that plus its own counters and takes its hold;
4. write the hold: the request's admission row (``running``, no tokens yet, its reservation in
   ``reserved_tokens``), which the ledger's own admission record then completes (same request id);
5. commit, which releases the lock.

So a second server admitting the same tenant at the same moment waits for the first one's commit
and sees its hold: simultaneous admissions can no longer both pass a limit. A hold whose request is
refused after all (``cancel``) is deleted again. With the database unreachable the server admits on
its own counters (the request path answers 503 elsewhere anyway)."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.alerts.events import AlertEmitter, AlertEvent
from loraplex.platform.db.base import utcnow
from loraplex.platform.quotas.store import WINDOW_S, Others
from loraplex.platform.usage.ledger import UsageLedger
from loraplex.platform.usage.models import UsageRecord
from loraplex.platform.usage.repository import others_usage

log = logging.getLogger("loraplex.platform.quotas")


def lock_key(tenant_id: str) -> int:
    """A stable signed 64-bit advisory-lock key per tenant (the same on every server)."""
    return int.from_bytes(
        hashlib.blake2b(f"loraplex-quota:{tenant_id}".encode(), digest_size=8).digest(), "big", signed=True
    )


@dataclass
class Window:
    """One admission in progress: what the others admitted, and the hold to write."""

    others: Others
    holds: list[tuple[str, int]] = field(default_factory=list)
    held: bool = False  # the holds were committed
    alerts: list[AlertEvent] = field(default_factory=list)  # the admission's alert events
    alerts_written: bool = False  # committed with the holds (or with the refusal)

    def hold(self, request_id: str, tokens: int) -> None:
        self.holds.append((request_id, tokens))


class LedgerAdmission:
    """The shared-window seam of ``InProcessQuotaStore`` for servers on one database."""

    def __init__(
        self, sessions: sessionmaker[Session], ledger: UsageLedger, outbox: AlertEmitter | None = None
    ) -> None:
        self._sessions = sessions
        self._outbox = outbox
        self._ledger = ledger
        self._instance_id = ledger.instance_id
        # One admission per tenant at a time in this process: a flood from one tenant then holds
        # at most one pooled connection waiting on the database lock, not the whole pool (which
        # the other tenants' requests need). Striped: bounded memory whatever the tenant count.
        self._stripes = [threading.Lock() for _ in range(64)]

    @contextmanager
    def window(self, tenant_id: str, period_start: datetime | None) -> Iterator[Window]:
        """Lock the tenant, read the others' usage, let the caller decide, write its holds, commit.
        The database being unreachable degrades to ``Others()`` and no holds (logged). An API key's
        own limits (scope ``key:<id>``, ``auth/key_scopes.py``) and a project's (``project:<id>``) have no ledger rows of their own:
        they stay per server, with nothing read or written here."""
        if tenant_id.startswith(("key:", "project:")):
            yield Window(Others())
            return
        with self._stripes[lock_key(tenant_id) % len(self._stripes)]:
            with self._shared_window(tenant_id, period_start) as win:
                yield win

    @contextmanager
    def _shared_window(self, tenant_id: str, period_start: datetime | None) -> Iterator[Window]:
        try:
            session = self._sessions()
        except SQLAlchemyError as exc:  # pragma: no cover - a sessionmaker does not connect
            log.debug("quota: shared window unavailable: %s", exc)
            yield Window(Others())
            return
        with session:
            try:
                self._lock(session, tenant_id)
                requests, tokens, budget = others_usage(
                    session, tenant_id, self._instance_id, utcnow() - timedelta(seconds=WINDOW_S), period_start
                )
            except SQLAlchemyError as exc:  # the database is down: this server's own counters decide
                session.rollback()
                log.debug("quota: other servers' usage unavailable: %s", exc)
                yield Window(Others())
                return
            win = Window(Others(int(requests), int(tokens), int(budget)))
            try:
                yield win
            except BaseException:
                # Refused: no hold; the refusal's alert (if any) is this transaction's only write.
                self._commit_alerts_only(session, win)
                raise
            if win.holds:
                now = utcnow()
                session.add_all(
                    UsageRecord(
                        request_id=rid,
                        tenant_id=tenant_id,
                        status="running",
                        reserved_tokens=tokens_held,
                        instance_id=self._instance_id,
                        created_at=now,
                        updated_at=now,
                    )
                    for rid, tokens_held in win.holds
                )
            try:
                if win.alerts and self._outbox is not None:
                    self._outbox.in_transaction(session, win.alerts)  # one commit: holds and alerts
                session.commit()  # the holds become visible and the lock is released together
            except Exception as exc:  # the database failed meanwhile: admitted on this server's counters
                session.rollback()
                log.warning(
                    "quota hold not written: %s", str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
                )
                return
            win.held = bool(win.holds)
            self._written(win)

    def _commit_alerts_only(self, session: Session, win: Window) -> None:
        if not win.alerts or self._outbox is None:
            session.rollback()
            return
        try:
            self._outbox.in_transaction(session, win.alerts)
            session.commit()
        except Exception as exc:  # noqa: BLE001 - the caller's refusal must still reach the client
            session.rollback()
            log.warning("alert not written with the refusal: %s", str(exc).splitlines()[0][:200] if str(exc) else exc)
            return
        self._written(win)

    def _written(self, win: Window) -> None:
        if win.alerts and self._outbox is not None:
            win.alerts_written = True
            self._outbox.committed(win.alerts)

    def drop(self, request_id: str) -> None:
        """A hold whose request was refused after reserving: the ledger deletes its row, in order
        with its other writes (never blocking the caller, which may be the event loop)."""
        self._ledger.discard(request_id)

    @staticmethod
    def _lock(session: Session, tenant_id: str) -> None:
        if session.get_bind().dialect.name == "postgresql":
            session.execute(select(func.pg_advisory_xact_lock(lock_key(tenant_id))))
        else:  # SQLite: any write statement takes the file's one write lock until commit
            session.execute(update(UsageRecord).where(UsageRecord.id == -1).values(status=UsageRecord.status))
