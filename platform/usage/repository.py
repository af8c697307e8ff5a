from __future__ import annotations

from datetime import datetime

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from loraplex.platform.usage.models import UsageRecord


def add_all(session: Session, records: list[UsageRecord]) -> None:
    session.add_all(records)
    session.flush()


def _bucket(session: Session, group_by: str):
    col = UsageRecord.created_at
    if group_by == "adapter":
        return func.coalesce(UsageRecord.adapter_name, "")
    if session.get_bind().dialect.name == "postgresql":
        return func.to_char(
            func.date_trunc(group_by, func.timezone("UTC", col)),
            'YYYY-MM-DD"T"HH24:MI:SS"Z"',
        )
    fmt = "%Y-%m-%dT%H:00:00Z" if group_by == "hour" else "%Y-%m-%dT00:00:00Z"
    return func.strftime(fmt, col)


def aggregate(
    session: Session,
    *,
    group_by: str,
    tenant_id: str | None,
    since: datetime | None,
    until: datetime | None,
) -> list[tuple]:
    """Rows of (key, requests, errors, prompt_tokens, completion_tokens), ordered by key."""
    key = _bucket(session, group_by).label("key")
    stmt = select(
        key,
        func.count(),
        func.sum(case((UsageRecord.status != "ok", 1), else_=0)),
        func.coalesce(func.sum(UsageRecord.prompt_tokens), 0),
        func.coalesce(func.sum(UsageRecord.completion_tokens), 0),
    ).group_by(key).order_by(key)
    if tenant_id is not None:
        stmt = stmt.where(UsageRecord.tenant_id == tenant_id)
    if since is not None:
        stmt = stmt.where(UsageRecord.created_at >= since)
    if until is not None:
        stmt = stmt.where(UsageRecord.created_at < until)
    return [tuple(r) for r in session.execute(stmt)]


def tokens_since(session: Session, tenant_id: str, since: datetime) -> int:
    stmt = select(
        func.coalesce(func.sum(UsageRecord.prompt_tokens + UsageRecord.completion_tokens), 0)
    ).where(UsageRecord.tenant_id == tenant_id, UsageRecord.created_at >= since)
    return int(session.scalar(stmt) or 0)
