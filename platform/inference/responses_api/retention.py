"""The periodic sweep of expired stored responses (they already read as absent: this frees the
space). Every server on a database sweeps; the deletes are idempotent, in short batches."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from loraplex.platform.db.session import unit_of_work
from loraplex.platform.inference.responses_api import store

if TYPE_CHECKING:  # the context is built above every service; only its type is needed here
    from loraplex.platform.context import PlatformContext

log = logging.getLogger("loraplex.platform.responses")
BATCH = 1000


def sweep_once(ctx: PlatformContext) -> int:
    """Delete every response past the retention, BATCH per transaction; how many went."""
    cutoff = store.Limits.from_settings(ctx.settings).cutoff()
    total = 0
    while True:
        with unit_of_work(ctx.sessions) as session:
            n = store.sweep(session, cutoff, BATCH)
        total += n
        if n < BATCH:
            return total


async def sweep_periodically(ctx: PlatformContext) -> None:
    interval = ctx.settings.responses.sweep_interval_s
    while True:
        try:
            removed = await asyncio.to_thread(sweep_once, ctx)
        except Exception as exc:  # noqa: BLE001 - e.g. the database is down: try again next time
            log.warning("stored responses sweep skipped: %s", str(exc).splitlines()[0][:200] if str(exc) else exc)
        else:
            if removed:
                log.info("deleted %d expired stored response(s)", removed)
        await asyncio.sleep(interval)
