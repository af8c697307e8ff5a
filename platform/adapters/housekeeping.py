"""Start-up housekeeping of the adapter store: a crash (kill -9) during an upload can leave a
staging folder, or a stored folder whose database row was never committed. Neither is ever used."""
from __future__ import annotations

import shutil

from loraplex.platform.adapters import repository
from loraplex.platform.adapters.store import AdapterStore
from sqlalchemy.orm import Session


def cleanup_store(session: Session, store: AdapterStore) -> list[str]:
    """Remove every staging folder and every stored folder no non-deleted adapter points at.
    Run it when no upload can be in progress (at start). Returns what was removed."""
    removed: list[str] = []
    if store.staging_root.exists():
        for entry in store.staging_root.iterdir():
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
            removed.append(f".staging/{entry.name}")
    in_use = repository.stored_paths_in_use(session)
    for relative in store.stored_paths():
        if relative not in in_use:
            store.remove(relative)
            removed.append(relative)
    return removed
