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
    in_use = repository.stored_paths_in_use(session)
    for relative in store.stored_paths():
        if relative not in in_use and _old_enough(store.path_of(relative), min_age_s):
            store.remove(relative)
            removed.append(relative)
    return removed


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
