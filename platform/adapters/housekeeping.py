"""Housekeeping of the adapter store: a crash (kill -9) during an upload can leave a staging
folder, or a stored folder whose database row was never committed. Neither is ever used; both are
removed at start and by a periodic sweep."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from loraplex.platform.adapters import repository
from loraplex.platform.adapters.store import AdapterStore
from loraplex.platform.db.session import unit_of_work

if TYPE_CHECKING:  # the context is built above every service; only its type is needed here
    from loraplex.platform.context import PlatformContext

log = logging.getLogger("loraplex.platform.adapters")


def _old_enough(path: Path, min_age_s: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime >= min_age_s
    except FileNotFoundError:
        return False


def cleanup_store(session: Session, store: AdapterStore, *, min_age_s: float = 0.0) -> list[str]:
    """Remove staging folders and stored folders no non-deleted adapter points at. At start
    (``min_age_s=0``) nothing can be in progress; the periodic sweep only takes folders older than
    any upload could be, so it never races one. Returns what was removed."""
    removed: list[str] = []
    if store.staging_root.exists():
        for entry in store.staging_root.iterdir():
            if not _old_enough(entry, min_age_s):
                continue
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(f".staging/{entry.name}")
    if not _store_belongs_to(session, store):
        return removed
    in_use = repository.stored_paths_in_use(session)
    for relative in store.stored_paths():
        if relative not in in_use and _old_enough(store.path_of(relative), min_age_s):
            store.remove(relative)
            removed.append(relative)
    return removed


OWNER_FILE = ".database"


def _database_identity(session: Session) -> str:
    """The database this server writes to, as its URL without the password (a SQLite file by its
    absolute path)."""
    bind = session.get_bind()
    engine = bind if isinstance(bind, Engine) else bind.engine
    url = engine.url.set(password=None)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        url = url.set(database=str(Path(url.database).resolve()))
    return url.render_as_string(hide_password=False)


def _store_belongs_to(session: Session, store: AdapterStore) -> bool:
    """Whether the stored folders are this database's to sweep. A store records the database that
    first swept it; a start on the same data dir with another database (an operator's wrong URL)
    sees every folder unreferenced, and must not delete the real database's adapters. Such a start
    leaves the folders alone and says so; the same database reached through another URL only
    keeps its leftovers until an operator removes the marker."""
    marker = store.root / OWNER_FILE
    identity = _database_identity(session)
    try:
        owner = marker.read_text().strip()
    except FileNotFoundError:
        store.root.mkdir(parents=True, exist_ok=True)
        marker.write_text(identity + "\n")
        return True
    if owner == identity:
        return True
    log.warning(
        "the adapter store %s belongs to another database (%s); its folders are not swept. "
        "Remove %s to let this database (%s) own it.",
        store.root,
        owner,
        marker,
        identity,
    )
    return False


async def sweep_periodically(ctx: PlatformContext, interval_s: float) -> None:
    """The same cleanup every ``interval_s`` while serving (folders older than the interval)."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            removed = await asyncio.to_thread(_sweep_once, ctx, interval_s)
        except Exception as exc:  # noqa: BLE001 - e.g. the database is down: try again next time
            log.warning("adapter store sweep skipped: %s", exc)
            continue
        if removed:
            log.warning("removed %d leftover adapter folder(s): %s", len(removed), ", ".join(removed))


def _sweep_once(ctx: PlatformContext, min_age_s: float) -> list[str]:
    with unit_of_work(ctx.sessions) as session:
        return cleanup_store(session, ctx.store, min_age_s=min_age_s)
