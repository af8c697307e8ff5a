"""The transactional outbox: an alert is a row written in the transaction that records what caused
it, so a crash or a database failure can never keep one without the other. The dispatcher
(``dispatcher.py``) delivers from it afterwards.

Inserts are ``ON CONFLICT (dedupe_key) DO NOTHING``: the "once per window" rule is the database's
unique index, exact across concurrent requests and servers. A process-local set of keys already
stored saves a write per request once an event exists."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.alerts.events import AlertEvent
from loraplex.platform.alerts.repository import insert_events

log = logging.getLogger("loraplex.platform.alerts")

_KNOWN_MAX = 10_000
_RETRY_MAX = 10_000


class Outbox:
    """``AlertEmitter`` over the platform's database."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions
        self._lock = threading.Lock()
        self._known: OrderedDict[str, None] = OrderedDict()  # dedupe keys stored (bounded LRU)
        # Events of a standalone emit whose write failed (database down): retried by the dispatcher.
        self._retry: deque[AlertEvent] = deque(maxlen=_RETRY_MAX)

    def pending(self, events: list[AlertEvent]) -> list[AlertEvent]:
        with self._lock:
            return [e for e in events if e.dedupe_key not in self._known]

    def in_transaction(self, session: Session, events: list[AlertEvent]) -> None:
        todo = self.pending(events)
        if todo:
            insert_events(session, todo)

    def committed(self, events: list[AlertEvent]) -> None:
        with self._lock:
            for e in events:
                self._known[e.dedupe_key] = None
                self._known.move_to_end(e.dedupe_key)
            while len(self._known) > _KNOWN_MAX:
                self._known.popitem(last=False)

    def emit(self, events: list[AlertEvent]) -> None:
        todo = self.pending(events)
        if not todo:
            return
        try:
            with self._sessions() as session:
                insert_events(session, todo)
                session.commit()
        except SQLAlchemyError as exc:
            log.warning("alert events kept for retry (database unavailable): %s", str(exc).splitlines()[0][:200])
            self._retry.extend(todo)
            return
        self.committed(todo)

    def retry_pending(self) -> int:
        """Write the events a failed ``emit`` kept (the dispatcher calls this every pass)."""
        with self._lock:
            todo = list(self._retry)
            self._retry.clear()
        if todo:
            self.emit(todo)
        return len(todo)
