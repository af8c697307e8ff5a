from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, case, delete, func, literal, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from loraplex.platform.usage.models import UsageRecord

# Columns a later write of the same request may change (the rest are fixed at admission).
# A quota hold (platform/quotas/shared.py) is the admission row written early, without these: the
# ledger's admission record completes it.
_MUTABLE = (
    "completion_tokens",
    "prompt_tokens",
    "ttft_ms",
    "latency_ms",
    "status",
    "updated_at",
    "api_key_id",
    "project_id",
    "adapter_id",
    "adapter_name",
    "endpoint",
    "user",
    "reserved_tokens",
    "http_request_id",
    "cached_tokens",
    "base_model",
)


def upsert(session: Session, rows: list[dict]) -> None:
    """Insert records or advance them, by request id. A final record is never changed again, so a
    replayed or duplicated write is harmless (idempotent).

    One exception: a record a peer closed as ``interrupted`` while its owner was in fact alive (the
    owner's lease lapsed on a stalled machine) is still the owner's. The owner's later writes (same
    ``instance_id``) win over that close: its final write bills what its client received. It is the
    same row (one per request id), so nothing is counted twice; a peer can never write over it."""
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    # One statement per distinct key set keeps executemany simple; the last write per id wins.
    latest: dict[str, dict] = {}
    for r in rows:
        latest[r["request_id"]] = r
    stmt = insert(UsageRecord)
    stmt = stmt.on_conflict_do_update(
        index_elements=[UsageRecord.request_id],
        set_={c: getattr(stmt.excluded, c) for c in _MUTABLE},
        where=(UsageRecord.status == "running")
        | ((UsageRecord.status == "interrupted") & (UsageRecord.instance_id == stmt.excluded.instance_id)),
    )
    session.execute(stmt, list(latest.values()))


def discard_holds(session: Session, request_ids: list[str], *, instance_id: str) -> int:
    """Delete quota holds (admission rows written by ``quotas/shared.py``) of requests refused
    after they reserved: only this server's rows the ledger never completed (no prompt tokens)."""
    result = cast(
        CursorResult[Any],
        session.execute(
            delete(UsageRecord).where(
                UsageRecord.request_id.in_(request_ids),
                UsageRecord.status == "running",
                UsageRecord.prompt_tokens == 0,
                UsageRecord.instance_id == instance_id,
            )
        ),
    )
    return int(result.rowcount or 0)


def close_running(session: Session, *, live_instances: list[str], now: datetime) -> int:
    """Records left running by a server that died (none of ``live_instances``, the servers holding a
    fresh lease): they become ``interrupted``, billed as checkpointed."""
    # An UPDATE's result is a CursorResult (it carries rowcount); Session.execute is typed as Result.
    result = cast(
        CursorResult[Any],
        session.execute(
            update(UsageRecord)
            .where(UsageRecord.status == "running", UsageRecord.instance_id.not_in(live_instances))
            .values(status="interrupted", updated_at=now)
        ),
    )
    return int(result.rowcount or 0)


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


def _window(stmt, tenant_id: str | None, since: datetime | None, until: datetime | None):
    if tenant_id is not None:
        stmt = stmt.where(UsageRecord.tenant_id == tenant_id)
    if since is not None:
        stmt = stmt.where(UsageRecord.created_at >= since)
    if until is not None:
        stmt = stmt.where(UsageRecord.created_at < until)
    return stmt


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
    stmt = (
        select(
            key,
            func.count(),
            func.sum(case((UsageRecord.status.in_(("error", "interrupted")), 1), else_=0)),
            func.coalesce(func.sum(UsageRecord.prompt_tokens), 0),
            func.coalesce(func.sum(UsageRecord.completion_tokens), 0),
        )
        .group_by(key)
        .order_by(key)
    )
    return [tuple(r) for r in session.execute(_window(stmt, tenant_id, since, until))]


def iter_records(
    session: Session,
    *,
    tenant_id: str | None,
    since: datetime | None,
    until: datetime | None,
    chunk: int = 1000,
) -> Iterator[UsageRecord]:
    """Every record in the window, oldest first, fetched in chunks (exports of any size)."""
    last_id = 0
    while True:
        stmt = _window(select(UsageRecord).where(UsageRecord.id > last_id), tenant_id, since, until)
        rows = list(session.scalars(stmt.order_by(UsageRecord.id).limit(chunk)))
        if not rows:
            return
        yield from rows
        last_id = rows[-1].id


def tokens_since(session: Session, tenant_id: str, since: datetime) -> int:
    stmt = select(func.coalesce(func.sum(UsageRecord.prompt_tokens + UsageRecord.completion_tokens), 0)).where(
        UsageRecord.tenant_id == tenant_id, UsageRecord.created_at >= since
    )
    return int(session.scalar(stmt) or 0)


def others_usage(
    session: Session, tenant_id: str, instance_id: str, window_since: datetime, period_start: datetime | None
) -> tuple[int, int, int]:
    """What other servers (every instance but ``instance_id``: neighbours, and earlier runs of this
    server) admitted for a tenant: requests and tokens since ``window_since`` (the last minute) and
    tokens since ``period_start`` (the budget period; 0 when None). A running request counts at
    the larger of its reservation and what it has used so far; an ended one at what it used."""
    used = UsageRecord.prompt_tokens + UsageRecord.completion_tokens
    cost = case(
        ((UsageRecord.status == "running") & (UsageRecord.reserved_tokens > used), UsageRecord.reserved_tokens),
        else_=used,
    )
    in_window = UsageRecord.created_at >= window_since
    since = window_since if period_start is None else min(window_since, period_start)
    stmt = select(
        func.coalesce(func.sum(case((in_window, 1), else_=0)), 0),
        func.coalesce(func.sum(case((in_window, cost), else_=0)), 0),
        func.coalesce(func.sum(case((UsageRecord.created_at >= period_start, cost), else_=0)), 0)
        if period_start is not None
        else literal(0),
    ).where(UsageRecord.tenant_id == tenant_id, UsageRecord.instance_id != instance_id, UsageRecord.created_at >= since)
    requests, tokens, budget = session.execute(stmt).one()
    return int(requests), int(tokens), int(budget)


def get_by_request_id(session: Session, request_id: str) -> UsageRecord | None:
    return session.scalar(select(UsageRecord).where(UsageRecord.request_id == request_id))
