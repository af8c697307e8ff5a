"""All SQL of the price book and of spend: prices are rows; spend is the usage ledger summed by
(group, adapter, base model, price segment), so a report reads each record once, in the database."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, Integer, case, cast, func, literal, select
from sqlalchemy.orm import Session

from loraplex.platform.pricing.models import Price
from loraplex.platform.usage.models import UsageRecord


def add(session: Session, price: Price) -> None:
    session.add(price)
    session.flush()


def list_prices(session: Session, model: str | None = None) -> list[Price]:
    stmt = select(Price)
    if model is not None:
        stmt = stmt.where(Price.model == model)
    return list(session.scalars(stmt.order_by(Price.model, Price.effective_from)))


def currencies(session: Session) -> list[str]:
    return list(session.scalars(select(Price.currency).distinct()))


def exists_at(session: Session, model: str, at: datetime) -> bool:
    return session.scalar(select(Price.id).where(Price.model == model, Price.effective_from == at)) is not None


def epoch_seconds(session: Session) -> ColumnElement[Any]:
    """A record's created_at as whole Unix seconds (UTC), for time buckets on both backends."""
    col = UsageRecord.created_at
    if session.get_bind().dialect.name == "postgresql":
        return cast(func.floor(func.extract("epoch", col)), BigInteger)
    return cast(func.strftime("%s", col), Integer)


def model_name() -> ColumnElement[Any]:
    """What a record was served as: its adapter, else its base model ("" for old rows with neither)."""
    return func.coalesce(UsageRecord.adapter_name, UsageRecord.base_model, "")


def segment(changes: Sequence[datetime]) -> ColumnElement[Any]:
    """How many price changes happened at or before a record's created_at (its price segment)."""
    if not changes:
        return literal(0)
    whens = [(UsageRecord.created_at >= t, k) for k, t in reversed(list(enumerate(changes, start=1)))]
    return case(*whens, else_=0)


def window(
    stmt: Any,
    *,
    tenant_id: str | None,
    since: datetime | None,
    until: datetime | None,
    key_ids: Sequence[str] | None = None,
    models: Sequence[str] | None = None,
    project_ids: Sequence[str] | None = None,
) -> Any:
    if tenant_id is not None:
        stmt = stmt.where(UsageRecord.tenant_id == tenant_id)
    if since is not None:
        stmt = stmt.where(UsageRecord.created_at >= since)
    if until is not None:
        stmt = stmt.where(UsageRecord.created_at < until)
    # None = no filter; an empty list matches nothing (a key scoped to no model sees no usage)
    if key_ids is not None:
        stmt = stmt.where(UsageRecord.api_key_id.in_(list(key_ids)))
    if models is not None:
        stmt = stmt.where(model_name().in_(list(models)))
    if project_ids is not None:
        stmt = stmt.where(UsageRecord.project_id.in_(list(project_ids)))
    return stmt


def sums(
    session: Session,
    groups: Sequence[ColumnElement[Any]],
    changes: Sequence[datetime],
    **filters: Any,
) -> list[tuple]:
    """Rows of (*groups, adapter_name, base_model, segment, requests, prompt, cached, completion)."""
    seg = segment(changes).label("segment")
    keys = [*groups, UsageRecord.adapter_name, UsageRecord.base_model, seg]
    stmt = select(
        *keys,
        func.count(),
        func.coalesce(func.sum(UsageRecord.prompt_tokens), 0),
        func.coalesce(func.sum(UsageRecord.cached_tokens), 0),
        func.coalesce(func.sum(UsageRecord.completion_tokens), 0),
    ).group_by(*keys)
    return [tuple(r) for r in session.execute(window(stmt, **filters))]


def iter_records(session: Session, *, chunk: int = 1000, **filters: Any) -> Iterator[UsageRecord]:
    """Every record in the window, oldest id first, in chunks (exports of any size)."""
    last_id = 0
    while True:
        stmt = window(select(UsageRecord).where(UsageRecord.id > last_id), **filters)
        rows = list(session.scalars(stmt.order_by(UsageRecord.id).limit(chunk)))
        if not rows:
            return
        yield from rows
        last_id = rows[-1].id
