"""The request path's budget step: after the token quota admitted a request (``inference.admission
.admit``), hold its worst-case cost against every budget of its key, project and tenant. Refused,
the token reservations go back too: nothing stays held for a request that will not run."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from loraplex.platform.budgets.models import Budget
from loraplex.platform.budgets.owners import request_scopes
from loraplex.platform.budgets.store import Cost, pk_in

if TYPE_CHECKING:
    from loraplex.platform.inference.admission import Prepared, Target


def reserve_for(ctx, target: Target, preps: list[Prepared]) -> list[Prepared]:
    """Blocking (database): run it in a worker thread. Attaches each prompt's ticket (``budget``)."""
    if not preps:
        return preps
    first = preps[0]
    costs = [Cost(p.request_id, len(p.prompt_ids), p.params.n * (p.params.max_tokens or 0)) for p in preps]
    try:
        tickets = ctx.budgets.reserve(
            request_scopes(first.auth),
            costs,
            first.model if target.adapter is not None else None,  # priced as the ledger names it
            ctx.engine.model_name or None,
        )
    except BaseException:
        for p in preps:
            ctx.quotas.cancel(p.reservation)
        raise
    for p, ticket in zip(preps, tickets or ()):
        p.budget = ticket
    return preps


def applies(session: Session, auth) -> bool:
    """Whether any budget covers this request's key, project or tenant: read in the admission's
    look-up transaction, so a request with none takes no extra thread or connection. (A budget set
    between that read and the admission applies from the next request.)"""
    return session.execute(select(Budget.scope).where(pk_in(request_scopes(auth))).limit(1)).first() is not None


async def reserve(ctx, target: Target, preps: list[Prepared]) -> list[Prepared]:
    """``reserve_for`` in a worker thread. A request cancelled meanwhile (its client left) gives
    back what the thread holds once it is done: a hold is never left without an owner to settle it."""
    if not getattr(target, "budgeted", True):
        return preps
    work = asyncio.ensure_future(run_in_threadpool(reserve_for, ctx, target, preps))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        work.add_done_callback(lambda f: _undo(ctx, preps, f))
        raise


def _undo(ctx, preps: list[Prepared], done: asyncio.Future) -> None:
    if done.cancelled() or done.exception() is not None:
        return  # refused or failed: ``reserve_for`` gave the token holds back itself
    for p in preps:
        ctx.quotas.cancel(p.reservation)
        ctx.budgets.release(p.budget)
