"""The usage ledger: every request that produced tokens is billed exactly once, with what the
client received, and nothing a crash or a database outage can lose once a write is acknowledged.

- ``open`` (at admission), ``checkpoint`` (every few seconds of a long stream) and ``close`` (at the
  end) each write the request's whole record, upserted by request id; the caller awaits ``open``
  before the first byte and ``close`` before the final chunk, so what it has sent is on record.
- One writer thread group-commits whatever is queued in one transaction (concurrent requests share
  a commit). A batch that fails for any other reason than an unreachable database (the database
  refuses its data, the driver cannot encode a string, any exception at all) is retried row by row,
  so one bad row never rejects the others (the bad one goes to ``usage.rejected.jsonl``), and every
  waiter is answered whatever happened: no request ever hangs on the ledger. A batch it cannot take at all
  (connection down) is appended to an fsync'd local spool, which counts as durable, and is replayed
  in order when the database answers again; while a spool exists, new writes queue behind it.
- At start, ``recover`` takes this server's lease (``lease.py``), replays the spool, then closes
  records left ``running`` by servers whose lease expired as ``interrupted`` (billed as of their
  last checkpoint); a live server on the same database keeps its running records.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.db.base import utcnow
from loraplex.platform.db.session import is_unreachable, unit_of_work
from loraplex.platform.usage import repository
from loraplex.platform.usage.lease import InstanceLease, live_instances
from loraplex.platform.usage.spool import REJECTED, Spool

log = logging.getLogger("loraplex.platform.usage")

_TIME_FIELDS = ("created_at", "updated_at")


@dataclass
class _Op:
    row: dict
    done: Future = field(default_factory=Future)


@dataclass
class LedgerStats:
    committed: int = 0
    spooled: int = 0
    replayed: int = 0
    rejected: int = 0
    batches: int = 0


class UsageLedger:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        spool_dir: Path,
        *,
        max_batch: int = 512,
        replay_interval_s: float = 1.0,
        lease_ttl_s: float = 30.0,
    ) -> None:
        self._sessions = sessions
        self.spool = Spool(spool_dir)
        self.instance_id = uuid.uuid4().hex
        self.lease = InstanceLease(sessions, self.instance_id, lease_ttl_s, on_beat=self.close_dead_runs)
        self.stats = LedgerStats()
        self._max_batch = max_batch
        self._replay_interval = replay_interval_s
        self._queue: list[_Op] = []
        lock = threading.RLock()  # one lock, two conditions: work queued / queue drained
        self._cond = threading.Condition(lock)
        self._idle = threading.Condition(lock)
        self._busy = False
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- API for requests ----------------------------------------------------------------------
    def write(self, **fields) -> Future:
        """Queue a record (the whole row, keyed by ``request_id``); the future resolves once the
        write is durable (committed or spooled)."""
        now = utcnow().isoformat()
        row = {"instance_id": self.instance_id, "updated_at": now, **fields}
        row.setdefault("created_at", now)
        op = _Op(row)
        with self._cond:
            self._queue.append(op)
            self._cond.notify_all()
            closed = self._stopping and self._thread is None
        if closed:  # a request ending after shutdown began: write it here and now
            self._drain_once()
        return op.done

    def discard(self, request_id: str) -> None:
        """A quota hold (``quotas/shared.py``) whose request was refused after reserving: delete
        its admission row, in queue order with the other writes. Only a row of this server that
        the request never recorded (``running``, no prompt tokens) goes; with the database
        unreachable it stays, and the next start closes it as interrupted with no tokens."""
        with self._cond:
            self._queue.append(_Op({_DISCARD: request_id}))
            self._cond.notify_all()

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until everything queued so far is durable (tests, budget reads, shutdown)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (self._queue or self._busy) and self._thread is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("usage ledger did not drain in time")
                self._idle.wait(left)
        if self._thread is None:  # not started (CLI contexts): write inline
            self._drain_once()

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> UsageLedger:
        self.lease.start()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="loraplex-ledger", daemon=True)
            self._thread.start()
        return self

    def recover(self) -> int:
        """At start: take this server's lease, replay the spool, then close records left running by
        servers whose lease expired (dead ones; a live neighbour's are left alone). Returns how many
        were closed as interrupted. Without the database it only logs (the writer retries)."""
        try:
            self.lease.beat()
            self._replay()
            return self.close_dead_runs()
        except SQLAlchemyError as exc:
            log.warning("usage recovery postponed, database unavailable: %s", exc)
            return 0

    def close_dead_runs(self) -> int:
        """Close as interrupted the running records of servers whose lease expired (at start, and
        after each lease renewal: a neighbour that died is noticed without a restart)."""
        with unit_of_work(self._sessions) as session:
            now = utcnow()
            live = live_instances(session, ttl_s=self.lease.ttl_s, now=now)
            closed = repository.close_running(session, live_instances=[*live, self.instance_id], now=now)
        if closed:
            log.warning("closed %d usage records of a server that stopped as interrupted", closed)
        return closed

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        self._drain_once()
        if self.spool.has_pending():  # a clean stop after an outage: land the spool now if we can
            try:
                self._replay()
            except Exception as exc:
                log.warning(
                    "spooled usage records remain in %s (replayed at the next start on this data dir): %s",
                    self.spool.folder,
                    str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__,
                )
        self.lease.release()

    # -- the writer ----------------------------------------------------------------------------
    def _run(self) -> None:
        last_replay = 0.0
        while True:
            with self._cond:
                if not self._queue and not self._stopping:
                    self._cond.wait(self._replay_interval if self.spool.has_pending() else None)
                if self._stopping and not self._queue:
                    return
                self._busy = True
            try:
                if self.spool.has_pending() and time.monotonic() - last_replay >= self._replay_interval:
                    last_replay = time.monotonic()
                    try:
                        self._replay()
                    except Exception as exc:  # still down: the spool waits for the next try
                        log.debug("usage replay postponed: %s", exc)
                self._drain_once()
            except Exception:  # the writer must never die; ops already resolved or spooled
                log.exception("usage ledger writer error")
                time.sleep(0.1)
            finally:
                with self._cond:
                    self._busy = False
                    self._idle.notify_all()

    def _drain_once(self) -> None:
        with self._cond:
            batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
        if not batch:
            return
        try:
            self._write_batch([op.row for op in batch])
            self.stats.batches += 1
        except BaseException as exc:  # neither the database nor the disk took it: the callers must know
            for op in batch:
                if not op.done.done():
                    op.done.set_exception(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        for op in batch:  # whatever happened to each row, every waiter is answered
            if not op.done.done():
                op.done.set_result(None)

    def _write_batch(self, rows: list[dict]) -> None:
        """Commit, or spool (database unreachable), or commit row by row (anything else: a row the
        database or the driver refuses, whatever the exception, must not take the others with it)."""
        discards = [r[_DISCARD] for r in rows if _DISCARD in r]
        if discards:
            rows = [r for r in rows if _DISCARD not in r]
            self._discard(discards)
            if not rows:
                return
        was_spooling = self.spool.has_pending()
        try:
            if was_spooling:  # keep order: nothing overtakes spooled records
                raise _SpoolFirst()
            self._commit(rows)
            self.stats.committed += len(rows)
        except _SpoolFirst:
            self._spool(rows, None)
        except Exception as exc:
            if is_unreachable(exc):
                self._spool(rows, exc)
            else:
                self._commit_one_by_one(rows)

    def _spool(self, rows: list[dict], exc: BaseException | None) -> None:
        was_spooling = self.spool.has_pending()
        self.spool.append(rows)  # OSError: neither DB nor disk, raised to the waiters
        self.stats.spooled += len(rows)
        if not was_spooling:
            log.warning(
                "database unreachable; usage records spooled to %s until it is back (%s)",
                self.spool.active,
                str(exc).splitlines()[0][:200] if exc is not None and str(exc) else "",
            )

    def _discard(self, request_ids: list[str]) -> None:
        try:
            with unit_of_work(self._sessions) as session:
                repository.discard_holds(session, request_ids, instance_id=self.instance_id)
        except Exception as exc:  # the row stays running: closed (no tokens) at this server's next start
            log.warning("could not drop %d quota holds: %s", len(request_ids), str(exc).splitlines()[0][:200])

    def _commit(self, rows: list[dict]) -> None:
        with unit_of_work(self._sessions) as session:
            repository.upsert(session, [_db_row(r) for r in rows])

    def _commit_one_by_one(self, rows: list[dict]) -> None:
        for row in rows:
            try:
                self._commit([row])
                self.stats.committed += 1
            except Exception as exc:
                if is_unreachable(exc):
                    self.spool.append([row])
                    self.stats.spooled += 1
                else:
                    log.error(
                        "usage record %s refused (kept in %s): %s: %s",
                        ascii(row.get("request_id")),
                        REJECTED,
                        type(exc).__name__,
                        ascii(str(exc)[:300]),
                    )
                    self.spool.append([{**row, "error": f"{type(exc).__name__}: {exc}"[:500]}], file=REJECTED)
                    self.stats.rejected += 1

    def _replay(self) -> None:
        for path in self.spool.take():
            rows = Spool.read(path)
            for i in range(0, len(rows), self._max_batch):
                chunk = rows[i : i + self._max_batch]
                try:
                    self._commit(chunk)
                except Exception as exc:
                    if is_unreachable(exc):
                        raise
                    self._commit_one_by_one(chunk)
            Spool.done(path)
            self.stats.replayed += len(rows)
            log.warning("replayed %d spooled usage records", len(rows))


_DISCARD = "__discard__"  # a queued op that deletes a quota hold instead of writing a row


class _SpoolFirst(Exception):
    pass


def _db_row(row: dict) -> dict:
    out = {k: _storable(v) if isinstance(v, str) else v for k, v in row.items() if k != "error"}
    for name in _TIME_FIELDS:
        if isinstance(out.get(name), str):
            out[name] = datetime.fromisoformat(out[name])
    # A row spooled by an older version lacks the columns added since: one batch's rows must share
    # their keys (a single executemany), so give them the defaults.
    out.setdefault("cached_tokens", 0)
    out.setdefault("base_model", None)
    out.setdefault("project_id", None)
    return out


def _storable(text: str) -> str:
    """Text every database can hold: a lone surrogate (not UTF-8) and a NUL (PostgreSQL text cannot
    hold it) become U+FFFD. The request guard (``http/text_guard.py``) refuses such text up front; a
    label that gets past it some other way must not cost the record (refused: its tokens unbilled)."""
    if "\x00" not in text:
        try:
            text.encode("utf-8")
            return text
        except UnicodeEncodeError:
            pass
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").replace("\x00", "\ufffd")
