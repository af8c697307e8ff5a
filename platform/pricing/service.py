"""The price book's rules (exact rates, one currency, no backdating) and spend reports."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import func
from sqlalchemy.orm import Session

from loraplex.platform.audit import service as audit
from loraplex.platform.auth.admin import Actor
from loraplex.platform.errors import BadRequest, Conflict
from loraplex.platform.pricing import money, repository
from loraplex.platform.pricing.book import Cost, PriceBook, Rate, cost_of
from loraplex.platform.pricing.models import Price
from loraplex.platform.pricing.schemas import PriceCreate, PriceOut, SpendBucket, SpendReport
from loraplex.platform.tenants.service import get_tenant
from loraplex.platform.usage.models import UsageRecord

_DAY = 86400


def price_out(p: Price) -> PriceOut:
    return PriceOut(
        id=p.id,
        model=p.model,
        input_per_mtok=money.rate_text(p.input_micros_per_mtok),
        cached_input_per_mtok=money.rate_text(p.cached_input_micros_per_mtok),
        output_per_mtok=money.rate_text(p.output_micros_per_mtok),
        currency=p.currency,
        effective_from=p.effective_from,
        created_by=p.created_by,
        created_at=p.created_at,
    )


def create_price(session: Session, actor: Actor, body: PriceCreate, *, now: datetime | None = None) -> Price:
    now = now or datetime.now(timezone.utc)
    model = body.model.strip()
    if not model:
        raise BadRequest('model must name a base model, an adapter, or "*"', param="model")
    input_rate = money.parse_rate(body.input_per_mtok, "input_per_mtok")
    cached_rate = (
        input_rate
        if body.cached_input_per_mtok is None
        else money.parse_rate(body.cached_input_per_mtok, "cached_input_per_mtok")
    )
    output_rate = money.parse_rate(body.output_per_mtok, "output_per_mtok")
    currency = body.currency.upper()
    others = [c for c in repository.currencies(session) if c != currency]
    if others:
        raise BadRequest(
            f"the price book is in {others[0]}: every price must use one currency (got {currency})",
            param="currency",
        )
    try:
        effective = now if body.effective_from is None else body.effective_from.astimezone(timezone.utc)
    except OverflowError:  # year 9999 at -05:00 has no UTC equivalent a datetime holds
        raise BadRequest("effective_from is out of range once converted to UTC", param="effective_from") from None
    # Records already served keep the price they were served at: a price may start now or later,
    # never earlier (that would rewrite the cost of history).
    if effective < now - timedelta(seconds=1):
        raise BadRequest(
            "effective_from is in the past: a price can start now or later, never rewrite the past",
            param="effective_from",
        )
    effective = max(effective, now)
    if repository.exists_at(session, model, effective):
        raise Conflict(f"{model} already has a price starting at {effective.isoformat()}", param="effective_from")
    price = Price(
        model=model,
        currency=currency,
        input_micros_per_mtok=input_rate,
        cached_input_micros_per_mtok=cached_rate,
        output_micros_per_mtok=output_rate,
        effective_from=effective,
        created_by=actor.name,
        created_at=now,
    )
    repository.add(session, price)
    audit.record(session, actor.name, "price.create", "price", price.id, None, price_out(price).model_dump(mode="json"))
    return price


def load_book(session: Session) -> PriceBook:
    rows = repository.list_prices(session)
    rates = [
        Rate(
            price_id=p.id,
            model=p.model,
            input=p.input_micros_per_mtok,
            cached_input=p.cached_input_micros_per_mtok,
            output=p.output_micros_per_mtok,
            effective_from=p.effective_from,
        )
        for p in rows
    ]
    return PriceBook(rates, rows[0].currency if rows else None)


class Tally:
    """Sums of one group: tokens, requests and cost (exact integers)."""

    def __init__(self) -> None:
        self.requests = self.prompt = self.cached = self.completion = self.unpriced = 0
        self.cost = Cost()

    def add(
        self, book: PriceBook, adapter: str | None, base: str | None, seg: int, n: int, p: int, c: int, o: int
    ) -> None:
        self.requests += n
        self.prompt, self.cached, self.completion = self.prompt + p, self.cached + c, self.completion + o
        rate = book.match_segment(adapter, base, seg)
        if rate is None:
            self.unpriced += n
        else:  # linear in tokens: the sum's cost is the sum of the records' costs, exactly
            self.cost = self.cost + cost_of(rate, p, c, o)

    def bucket(self, key: str) -> SpendBucket:
        return SpendBucket(
            key=key,
            requests=self.requests,
            prompt_tokens=self.prompt,
            cached_tokens=self.cached,
            completion_tokens=self.completion,
            cost=money.cost_text(self.cost.total),
            unpriced_requests=self.unpriced,
        )


def check_window(start: datetime | None, end: datetime | None) -> None:
    if start is not None and end is not None and start >= end:
        raise BadRequest("start must be earlier than end", param="start")


def spend(
    session: Session,
    *,
    group_by: str,
    tenant_id: str | None,
    start: datetime | None,
    end: datetime | None,
) -> SpendReport:
    check_window(start, end)
    if tenant_id is not None:
        get_tenant(session, tenant_id, include_deleted=True)  # history outlives the tenant
    book = load_book(session)
    groups: list[Any] = []
    if group_by == "tenant":
        groups = [UsageRecord.tenant_id]
    elif group_by == "key":
        groups = [func.coalesce(UsageRecord.api_key_id, "")]
    elif group_by == "project":  # "" gathers the keys of no project
        groups = [func.coalesce(UsageRecord.project_id, "")]
    elif group_by == "day":
        groups = [repository.epoch_seconds(session) // _DAY]
    rows = repository.sums(session, groups, book.changes, tenant_id=tenant_id, since=start, until=end)
    tallies: dict[str, Tally] = {}
    total = Tally()
    for row in rows:
        *g, adapter, base, seg, n, p, c, o = row
        if group_by == "model":
            key = adapter or base or ""
        elif group_by == "day":
            key = datetime.fromtimestamp(int(g[0]) * _DAY, timezone.utc).strftime("%Y-%m-%d")
        else:
            key = str(g[0])
        args = (book, adapter, base, int(seg), int(n), int(p), int(c), int(o))
        tallies.setdefault(key, Tally()).add(*args)
        total.add(*args)
    return SpendReport(
        group_by=group_by,
        currency=book.currency,
        tenant_id=tenant_id,
        start=start,
        end=end,
        data=[tallies[k].bucket(k) for k in sorted(tallies)],
        totals=total.bucket("total"),
    )


EXPORT_FIELDS = (
    "request_id",
    "created_at",
    "tenant_id",
    "api_key_id",
    "project_id",
    "model",
    "base_model",
    "adapter_name",
    "status",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "price_id",
    "input_cost",
    "cached_input_cost",
    "output_cost",
    "cost",
    "currency",
)


def export_rows(
    session: Session, *, tenant_id: str | None, start: datetime | None, end: datetime | None
) -> Iterator[dict]:
    """Every record in the window with the price it paid and its exact cost (an invoice's lines)."""
    book = load_book(session)
    for r in repository.iter_records(session, tenant_id=tenant_id, since=start, until=end):
        rate = book.match(r.adapter_name, r.base_model, r.created_at)
        cost = cost_of(rate, r.prompt_tokens, r.cached_tokens, r.completion_tokens) if rate else Cost()
        yield {
            "request_id": r.request_id,
            "created_at": r.created_at.isoformat(),
            "tenant_id": r.tenant_id,
            "api_key_id": r.api_key_id or "",
            "project_id": r.project_id or "",
            "model": r.adapter_name or r.base_model or "",
            "base_model": r.base_model or "",
            "adapter_name": r.adapter_name or "",
            "status": r.status,
            "prompt_tokens": r.prompt_tokens,
            "cached_tokens": r.cached_tokens,
            "completion_tokens": r.completion_tokens,
            "price_id": rate.price_id if rate else "",
            "input_cost": money.cost_text(cost.input),
            "cached_input_cost": money.cost_text(cost.cached_input),
            "output_cost": money.cost_text(cost.output),
            "cost": money.cost_text(cost.total),
            "currency": book.currency or "",
        }
