"""A server's lease on the usage ledger: a heartbeat row in ``server_instances``. Start-up recovery
closes the running records only of servers whose lease expired (they are dead), never those of a
live neighbour on the same database (a rolling restart, blue-green, two servers side by side).

The heartbeat has a thread and a database connection of its own: a server whose request handlers
hold every pooled connection, or whose event loop is busy, still renews on time. A lease expires
only after ``BEATS_PER_TTL`` missed renewals. Should it lapse anyway (a machine stopped for longer
than the ttl), a peer may close this server's running rows as ``interrupted``; this server's own
later writes win over that close (``repository.upsert``), so billing stays what the client got."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import Engine, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.db.base import utcnow
from loraplex.platform.db.session import make_db_engine, make_session_factory, unit_of_work
from loraplex.platform.usage.models import ServerInstance

log = logging.getLogger("loraplex.platform.usage")

# Renewals per ttl: a lease is taken for dead only after this many beats in a row were missed.
BEATS_PER_TTL = 5


class InstanceLease:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        instance_id: str,
        ttl_s: float,
        on_beat: Callable[[], object] | None = None,
    ) -> None:
        self._sessions, self._engine = _own_sessions(sessions)
        self._on_beat = on_beat  # run after each renewal: close the records of servers that died since
        self.instance_id = instance_id
        self.ttl_s = ttl_s
        self._started_at = utcnow()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """Renew the lease (raises if the database cannot be reached)."""
        now = utcnow()
        with unit_of_work(self._sessions) as session:
            dialect = session.get_bind().dialect.name
            insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
            row = dict(
                instance_id=self.instance_id,
                hostname=socket.gethostname()[:255],
                pid=os.getpid(),
                started_at=self._started_at,
                heartbeat_at=now,
            )
            stmt = insert(ServerInstance).values(**row)
            session.execute(stmt.on_conflict_do_update(index_elements=["instance_id"], set_={"heartbeat_at": now}))

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="loraplex-lease", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / BEATS_PER_TTL):
            try:
                self.beat()
                if self._on_beat is not None:
                    self._on_beat()
            except Exception as exc:  # the database is down: the writer spools; try again next beat
                log.warning("could not renew the server lease: %s", str(exc).splitlines()[0][:200])

    def release(self) -> None:
        """A clean stop: every request of this server has ended, so drop the lease row."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        try:
            with unit_of_work(self._sessions) as session:
                session.execute(delete(ServerInstance).where(ServerInstance.instance_id == self.instance_id))
        except Exception as exc:  # expires on its own
            log.warning("could not release the server lease: %s", str(exc).splitlines()[0][:200])
        if self._engine is not None:
            self._engine.dispose()


def _own_sessions(shared: sessionmaker[Session]) -> tuple[sessionmaker[Session], Engine | None]:
    """Sessions on an engine of the lease's own (one connection, never queued behind requests),
    except for an in-memory SQLite database, which another engine would not see."""
    bind = shared.kw.get("bind")
    if not isinstance(bind, Engine):
        return shared, None
    url = bind.url
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        return shared, None
    engine = make_db_engine(url.render_as_string(hide_password=False))
    return make_session_factory(engine), engine


def live_instances(session: Session, *, ttl_s: float, now: datetime) -> list[str]:
    """Servers whose lease is still fresh, less those of this host whose process is gone (a server
    killed a moment ago and restarted here need not wait for its lease to expire)."""
    cutoff = now - timedelta(seconds=ttl_s)
    rows = session.execute(
        select(ServerInstance.instance_id, ServerInstance.hostname, ServerInstance.pid).where(
            ServerInstance.heartbeat_at >= cutoff
        )
    )
    host = socket.gethostname()[:255]
    return [iid for iid, hostname, pid in rows if hostname != host or _pid_alive(pid)]


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
