"""An ``AlertEmitter`` for a caller that must never wait on the database: the control-plane actor
of a Ray deployment (``cluster/control.py``) runs one call at a time for every ingress, so a
database write (or an outage's connect timeout) inside ``reserve`` would stall every admission of
the cluster. ``emit`` only queues; a thread of this process writes the queue through the
``Outbox`` (``ON CONFLICT DO NOTHING`` on the dedupe key, as the local store's events) and keeps
what failed for the next try.

Not transactional with the consumption: the actor's counters, not a database row, are the record
of a cluster's holds. A crash between the hold and the write loses no alert that still matters:
thresholds are checked by level ("usage has reached 80 %"), so the next reservation of the window
(on the restarted actor, whose memory is empty) raises the event again, and a refusal repeats on
the next refused request."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque

from loraplex.platform.alerts.events import AlertEvent
from loraplex.platform.alerts.outbox import Outbox

log = logging.getLogger("loraplex.platform.alerts")

_SEEN_MAX = 10_000
_QUEUE_MAX = 10_000


class QueuedEmitter:
    def __init__(self, outbox: Outbox, interval_s: float = 0.5) -> None:
        self._outbox = outbox
        self._interval_s = interval_s
        self._cv = threading.Condition()
        self._queue: deque[AlertEvent] = deque(maxlen=_QUEUE_MAX)
        self._seen: OrderedDict[str, None] = OrderedDict()  # dedupe keys queued (bounded LRU)
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="loraplex-alert-writer", daemon=True)
        self._thread.start()

    def pending(self, events: list[AlertEvent]) -> list[AlertEvent]:
        with self._cv:
            return [e for e in self._outbox.pending(events) if e.dedupe_key not in self._seen]

    def in_transaction(self, session, events: list[AlertEvent]) -> None:
        self.emit(events)  # no transaction of the caller's is ever open here

    def committed(self, events: list[AlertEvent]) -> None:
        pass

    def emit(self, events: list[AlertEvent]) -> None:
        todo = self.pending(events)
        if not todo:
            return
        with self._cv:
            for e in todo:
                self._seen[e.dedupe_key] = None
            while len(self._seen) > _SEEN_MAX:
                self._seen.popitem(last=False)
            self._queue.extend(todo)
            self._cv.notify()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until the queue has been handed to the outbox (tests, shutdown)."""
        with self._cv:
            self._cv.notify()
            return self._cv.wait_for(lambda: not self._queue, timeout)

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(5)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._stop, self._interval_s)
                if self._stop:
                    return
                batch = list(self._queue)
                self._queue.clear()
                self._cv.notify_all()
            try:
                if batch:
                    self._outbox.emit(batch)  # a failed write is kept by the outbox for retry
                self._outbox.retry_pending()
            except Exception as exc:  # noqa: BLE001 - never let the writer thread die
                log.warning("alerts: writing queued events failed: %s", str(exc).splitlines()[0][:200])
