"""Engine and session factory: SQLite gets WAL + foreign keys, PostgreSQL is used as is."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker


def make_db_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=FULL")  # a commit (a usage record) survives power loss, not just a crash
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def on_commit(session: Session, callback: Callable[[], object]) -> None:
    """Run ``callback`` once the surrounding unit of work has committed (engine sync, file cleanup)."""
    session.info.setdefault("on_commit", []).append(callback)


def on_rollback(session: Session, callback: Callable[[], None]) -> None:
    """Undo a side effect made before commit (a stored file, an engine registration)."""
    session.info.setdefault("on_rollback", []).append(callback)


@contextmanager
def unit_of_work(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One transaction: commit at the end, roll back (and undo side effects) on any error."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        for undo in reversed(session.info.pop("on_rollback", [])):
            try:
                undo()
            except Exception:  # best effort: the original error matters more
                pass
        raise
    else:
        session.info.pop("on_rollback", None)
        for callback in session.info.pop("on_commit", []):
            callback()
    finally:
        session.close()


def is_unreachable(exc: BaseException) -> bool:
    """The database could not be reached (as opposed to refusing this data)."""
    if isinstance(exc, (OperationalError, InterfaceError, DisconnectionError)):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)
