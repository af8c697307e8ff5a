"""Setting, reading and removing budgets (the admin API). Amounts are exact (``amounts``); a new
budget, or one whose period or timezone changed, starts its window with what the ledger already
charged the scope in it (the spend report's arithmetic), so setting a budget mid-month counts the
month's spend so far."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from loraplex.platform.audit import service as audit
from loraplex.platform.auth.admin import Actor
from loraplex.platform.budgets.amounts import AMOUNT_DECIMALS, micros_to_units, parse_amount
from loraplex.platform.budgets.models import Budget, BudgetHold
from loraplex.platform.budgets.owners import owner_tenant
from loraplex.platform.budgets.periods import window_end, window_start, zone
from loraplex.platform.budgets.schemas import BudgetIn, BudgetOut
from loraplex.platform.errors import NotFound, Unprocessable
from loraplex.platform.pricing import money
from loraplex.platform.pricing import repository as pricing_repo
from loraplex.platform.pricing.service import Tally, load_book

_MAX_UNITS = 2**62  # what a window may start with (a BIGINT, with room for the holds)


def put_budget(
    session: Session, actor: Actor, scope: str, scope_id: str, body: BudgetIn, *, now: datetime | None = None
) -> BudgetOut:
    now = now or datetime.now(timezone.utc)
    micros = parse_amount(body.amount)
    if zone(body.timezone) is None:
        raise Unprocessable(
            f"timezone must be an IANA timezone name such as Europe/Paris (got {body.timezone[:64]!r})",
            param="timezone",
            code="invalid_timezone",
        )
    tenant_id = owner_tenant(session, scope, scope_id)
    book_currencies = pricing_repo.currencies(session)
    currency = (body.currency or (book_currencies[0] if book_currencies else "USD")).upper()
    if not (len(currency) == 3 and currency.isascii() and currency.isalpha()):
        raise Unprocessable("currency must be a three-letter code such as USD", param="currency")
    if book_currencies and currency not in book_currencies:
        raise Unprocessable(
            f"the price book is in {book_currencies[0]}: a budget must use the same currency (got {currency})",
            param="currency",
        )
    b = session.get(Budget, (scope, scope_id), with_for_update=True)
    before = out(b, now).model_dump(mode="json") if b is not None else None
    start = window_start(body.period, body.timezone, now)
    if b is None:
        spent = ledger_spend(session, scope, scope_id, start)  # before the add: a query autoflushes
        b = Budget(scope=scope, scope_id=scope_id, tenant_id=tenant_id, created_at=now, window_start=start)
        b.spent_units, b.reserved_units = spent, held_in(session, scope, scope_id, start)
        session.add(b)
    elif (b.period, b.timezone) != (body.period, body.timezone) or b.window_start != start:
        # a new window: what the ledger charged in it so far, and the holds admitted in it
        b.spent_units = ledger_spend(session, scope, scope_id, start)
        b.reserved_units = held_in(session, scope, scope_id, start)
    b.window_start = start
    b.amount_micros, b.currency, b.period, b.timezone = micros, currency, body.period, body.timezone
    b.updated_by, b.updated_at = actor.name, now
    session.flush()
    after = out(b, now)
    audit.record(session, actor.name, "budget.put", scope, scope_id, before, after.model_dump(mode="json"))
    return after


def get_budget(session: Session, scope: str, scope_id: str, *, now: datetime | None = None) -> BudgetOut:
    owner_tenant(session, scope, scope_id)
    b = session.get(Budget, (scope, scope_id))
    if b is None:
        raise NotFound(f"no budget is set on this {scope}", param="budget")
    return out(b, now or datetime.now(timezone.utc))


def delete_budget(session: Session, actor: Actor, scope: str, scope_id: str) -> None:
    owner_tenant(session, scope, scope_id)
    b = session.get(Budget, (scope, scope_id), with_for_update=True)
    if b is None:
        raise NotFound(f"no budget is set on this {scope}", param="budget")
    before = out(b, datetime.now(timezone.utc)).model_dump(mode="json")
    # Its holds go with it: the requests still running settle into nothing (store.settle_now).
    session.execute(delete(BudgetHold).where(BudgetHold.scope == scope, BudgetHold.scope_id == scope_id))
    session.delete(b)
    audit.record(session, actor.name, "budget.delete", scope, scope_id, before, None)


def out(b: Budget, now: datetime) -> BudgetOut:
    start = window_start(b.period, b.timezone, now)
    spent, reserved = (b.spent_units, b.reserved_units) if b.window_start == start else (0, 0)
    limit = micros_to_units(b.amount_micros)
    return BudgetOut(
        scope=b.scope,
        scope_id=b.scope_id,
        tenant_id=b.tenant_id,
        amount=money.fixed(b.amount_micros, AMOUNT_DECIMALS),
        currency=b.currency,
        period=b.period,
        timezone=b.timezone,
        window_start=start,
        window_end=window_end(b.period, b.timezone, start),
        spent=money.cost_text(spent),
        reserved=money.cost_text(reserved),
        remaining=money.cost_text(max(0, limit - spent - reserved)),
        updated_by=b.updated_by,
        updated_at=b.updated_at,
    )


def ledger_spend(session: Session, scope: str, scope_id: str, since: datetime) -> int:
    """What the usage ledger charged ``scope_id`` since ``since`` (units of 10^-12), priced as the
    spend report prices it."""
    book = load_book(session)
    filters: dict[str, Any] = {"tenant_id": None, "since": since, "until": None}
    if scope == "tenant":
        filters["tenant_id"] = scope_id
    elif scope == "key":
        filters["key_ids"] = [scope_id]
    else:
        return 0  # a project's records are attributed once the ledger carries project ids
    tally = Tally()
    for row in pricing_repo.sums(session, [], book.changes, **filters):
        adapter, base, seg, n, p, c, o = row
        tally.add(book, adapter, base, int(seg), int(n), int(p), int(c), int(o))
    return min(tally.cost.total, _MAX_UNITS)


def held_in(session: Session, scope: str, scope_id: str, start: datetime) -> int:
    """What running requests admitted in the window starting at ``start`` hold on this budget."""
    total = session.scalar(
        select(func.coalesce(func.sum(BudgetHold.amount_units), 0)).where(
            BudgetHold.scope == scope, BudgetHold.scope_id == scope_id, BudgetHold.window_start == start
        )
    )
    return int(total or 0)
