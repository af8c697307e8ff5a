"""Usage records are written in batches by a background thread, off the request path, and flushed
on shutdown."""
from __future__ import annotations

import logging
import threading

from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.db.session import unit_of_work
from loraplex.platform.usage import repository
from loraplex.platform.usage.models import UsageRecord

log = logging.getLogger("loraplex.platform.usage")


class UsageWriter:
    def __init__(self, sessions: sessionmaker[Session], flush_interval_s: float = 0.5, max_batch: int = 256) -> None:
        self._sessions = sessions
        self._interval = flush_interval_s
        self._max_batch = max_batch
        self._pending: list[dict] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="loraplex-usage", daemon=True)
        self._thread.start()

    def add(self, **fields) -> None:
        with self._cond:
            self._pending.append(fields)
            if len(self._pending) >= self._max_batch:
                self._cond.notify()

    def flush(self) -> None:
        with self._cond:
            batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            with unit_of_work(self._sessions) as session:
                repository.add_all(session, [UsageRecord(**f) for f in batch])
        except Exception:  # a lost batch must not take the server down; it is logged
            log.exception("could not write %d usage records", len(batch))

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(10)
        self.flush()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._stopping:
                    self._cond.wait(self._interval)
                stopping = self._stopping
            self.flush()
            if stopping:
                return
