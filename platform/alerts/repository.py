"""All of the alerts' SQL. Claims are safe with several servers on one database: on PostgreSQL the
candidate rows are locked with ``FOR UPDATE SKIP LOCKED`` (a second server takes other rows instead
of waiting); on both backends the claim is ONE ``UPDATE ... RETURNING`` whose own WHERE repeats the
"free" condition (state pending, lease expired or none), so a row two servers raced for is
re-checked against the winner's write and lost by the other (SQLite: the write lock serializes the
two statements)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

from sqlalchemy import Select, delete, exists, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from loraplex.platform.alerts.events import AlertEvent, body_of
from loraplex.platform.alerts.models import DEAD, DELIVERED, PENDING, AlertDelivery, AlertEventRow, AlertWebhook
from loraplex.platform.db.base import new_id, utcnow


def _skip_locked(session: Session, stmt: Select) -> Select:
    if session.get_bind().dialect.name == "postgresql":
        return stmt.with_for_update(skip_locked=True)
    return stmt


def work_waiting(session: Session, now: datetime) -> bool:
    """Anything to fan out or deliver? A plain read first, so an idle pass never takes SQLite's one
    write lock (which every admission of a limited tenant needs)."""
    unfanned = select(AlertEventRow.id).where(AlertEventRow.fanned_out.is_(False)).limit(1)
    due = (
        select(AlertDelivery.id)
        .where(
            AlertDelivery.state == PENDING,
            AlertDelivery.next_attempt_at <= now,
            or_(AlertDelivery.lease_expires_at.is_(None), AlertDelivery.lease_expires_at < now),
        )
        .limit(1)
    )
    return session.scalar(unfanned) is not None or session.scalar(due) is not None


def fan_out(session: Session, now: datetime, limit: int, max_per_event: int) -> int:
    """Create the deliveries of events not yet fanned out, for the webhooks matching them now: at
    most ``max_per_event`` per event, the oldest webhooks first (registration refuses a webhook
    past the cap; this holds it too when the setting was lowered after registration)."""
    candidates = _skip_locked(
        session,
        select(AlertEventRow.id)
        .where(AlertEventRow.fanned_out.is_(False))
        .order_by(AlertEventRow.created_at)
        .limit(limit),
    )
    ids = list(
        session.scalars(
            update(AlertEventRow)
            .where(AlertEventRow.id.in_(candidates.scalar_subquery()), AlertEventRow.fanned_out.is_(False))
            .values(fanned_out=True)
            .returning(AlertEventRow.id),
            execution_options={"synchronize_session": False},
        )
    )
    if not ids:
        return 0
    events = list(session.scalars(select(AlertEventRow).where(AlertEventRow.id.in_(ids))))
    hooks = list(session.scalars(select(AlertWebhook).order_by(AlertWebhook.created_at, AlertWebhook.id)))
    made = 0
    for event in events:
        matching = [
            h
            for h in hooks
            if (h.tenant_id is None or h.tenant_id == event.tenant_id) and (not h.events or event.kind in h.events)
        ]
        for hook in matching[:max_per_event]:
            session.add(AlertDelivery(event_id=event.id, webhook_id=hook.id, state=PENDING, next_attempt_at=now))
            made += 1
    return made


def claim(session: Session, owner: str, now: datetime, lease_s: float, limit: int) -> list[int]:
    free = (AlertDelivery.state == PENDING) & or_(
        AlertDelivery.lease_expires_at.is_(None), AlertDelivery.lease_expires_at < now
    )
    candidates = _skip_locked(
        session,
        select(AlertDelivery.id)
        .where(free, AlertDelivery.next_attempt_at <= now)
        .order_by(AlertDelivery.next_attempt_at)
        .limit(limit),
    )
    return list(
        session.scalars(
            update(AlertDelivery)
            .where(AlertDelivery.id.in_(candidates.scalar_subquery()), free)
            .values(
                lease_owner=owner,
                lease_expires_at=now + timedelta(seconds=lease_s),
                attempts=AlertDelivery.attempts + 1,
            )
            .returning(AlertDelivery.id),
            execution_options={"synchronize_session": False},
        )
    )


def claimed(session: Session, ids: list[int]) -> list[tuple[AlertDelivery, AlertEventRow, AlertWebhook]]:
    rows = session.execute(
        select(AlertDelivery, AlertEventRow, AlertWebhook)
        .join(AlertEventRow, AlertEventRow.id == AlertDelivery.event_id)
        .join(AlertWebhook, AlertWebhook.id == AlertDelivery.webhook_id)
        .where(AlertDelivery.id.in_(ids))
    )
    return [(d, e, w) for d, e, w in rows]


def finish(
    session: Session,
    delivery_id: int,
    owner: str,
    *,
    ok: bool,
    now: datetime,
    status: int | None,
    error: str | None,
    retry_at: datetime | None,
) -> bool:
    """Record an attempt's outcome, only while this server still holds the lease (else another
    server took the row over after the lease expired, and its outcome is the one that counts)."""
    values: dict = {"lease_owner": None, "lease_expires_at": None, "last_status": status, "last_error": error}
    if ok:
        values.update(state=DELIVERED, delivered_at=now)
    elif retry_at is None:
        values.update(state=DEAD)
    else:
        values.update(next_attempt_at=retry_at)
    result = session.execute(
        update(AlertDelivery)
        .where(AlertDelivery.id == delivery_id, AlertDelivery.lease_owner == owner, AlertDelivery.state == PENDING)
        .values(**values),
        execution_options={"synchronize_session": False},
    )
    return bool(getattr(result, "rowcount", 0))


def sweep(session: Session, cutoff: datetime, now: datetime, batch: int) -> tuple[int, int]:
    """Retention: delete up to ``batch`` finished deliveries (delivered or dead) older than
    ``cutoff``, then up to ``batch`` events older than ``cutoff`` with no delivery left. An event
    is kept while its window is open, whatever its age: its row is the "once per window" record
    (the unique dedupe key), and deleting it would let the same window fire again. Pending
    deliveries are never touched. Returns (deliveries, events) deleted."""
    finished_at = func.coalesce(AlertDelivery.delivered_at, AlertDelivery.next_attempt_at)
    old = (
        select(AlertDelivery.id)
        .where(AlertDelivery.state.in_((DELIVERED, DEAD)), finished_at < cutoff)
        .limit(batch)
        .scalar_subquery()
    )
    gone = session.execute(
        delete(AlertDelivery).where(AlertDelivery.id.in_(old)), execution_options={"synchronize_session": False}
    )
    deliveries = int(getattr(gone, "rowcount", 0) or 0)
    candidates = session.execute(
        select(AlertEventRow.id, AlertEventRow.body)
        .where(
            AlertEventRow.created_at < cutoff,
            AlertEventRow.fanned_out.is_(True),
            ~exists().where(AlertDelivery.event_id == AlertEventRow.id),
        )
        .order_by(AlertEventRow.created_at)
        .limit(batch)
    )
    closed = [eid for eid, body in candidates if _window_end(body) <= now]
    if not closed:
        return deliveries, 0
    gone = session.execute(
        delete(AlertEventRow).where(AlertEventRow.id.in_(closed)), execution_options={"synchronize_session": False}
    )
    return deliveries, int(getattr(gone, "rowcount", 0) or 0)


def _window_end(body: str) -> datetime:
    """The end of an event's window, from its stored body; an unreadable one counts as open."""
    try:
        end = datetime.fromisoformat(json.loads(body)["data"]["window"]["end"])
    except (ValueError, KeyError, TypeError):
        return datetime.max.replace(tzinfo=UTC)
    return end if end.tzinfo is not None else end.replace(tzinfo=UTC)


def list_events(session: Session, limit: int, tenant_id: str | None, kind: str | None) -> list[AlertEventRow]:
    stmt = select(AlertEventRow).order_by(AlertEventRow.created_at.desc(), AlertEventRow.id).limit(limit)
    if tenant_id is not None:
        stmt = stmt.where(AlertEventRow.tenant_id == tenant_id)
    if kind is not None:
        stmt = stmt.where(AlertEventRow.kind == kind)
    return list(session.scalars(stmt))


def deliveries_of(session: Session, event_ids: list[str]) -> list[AlertDelivery]:
    if not event_ids:
        return []
    return list(
        session.scalars(select(AlertDelivery).where(AlertDelivery.event_id.in_(event_ids)).order_by(AlertDelivery.id))
    )


def lock_webhooks(session: Session) -> None:
    """Serialize webhook registrations (the caps are counted, then a row is added): PostgreSQL a
    transaction-scoped advisory lock, SQLite the file's write lock taken by a write that changes
    nothing. Registrations are rare; one lock for all of them is enough."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_advisory_xact_lock(_WEBHOOK_LOCK)))
    else:
        session.execute(update(AlertWebhook).where(AlertWebhook.id == "").values(url=AlertWebhook.url))


_WEBHOOK_LOCK = int.from_bytes(hashlib.blake2b(b"loraplex-webhooks", digest_size=8).digest(), "big", signed=True)


def webhook_counts(session: Session) -> tuple[int, dict[str, int]]:
    """(operator-wide webhooks, i.e. tenant_id NULL; per tenant: that tenant's own webhooks)."""
    rows = session.execute(select(AlertWebhook.tenant_id, func.count()).group_by(AlertWebhook.tenant_id))
    counts = {tid: int(n) for tid, n in rows}
    return counts.pop(None, 0), {str(k): v for k, v in counts.items()}


def list_webhooks(session: Session) -> list[AlertWebhook]:
    return list(session.scalars(select(AlertWebhook).order_by(AlertWebhook.created_at, AlertWebhook.id)))


def delete_webhook(session: Session, webhook_id: str) -> bool:
    # Its deliveries go with it (a receiver removed is not retried); the events stay.
    session.execute(delete(AlertDelivery).where(AlertDelivery.webhook_id == webhook_id))
    result = session.execute(delete(AlertWebhook).where(AlertWebhook.id == webhook_id))
    return bool(getattr(result, "rowcount", 0))


def insert_events(session: Session, events: list[AlertEvent]) -> None:
    """Add ``events`` to ``session``'s transaction; one already stored (same dedupe key) is skipped."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    now = utcnow()
    tenants = _tenants_of_keys(session, {e.key_id for e in events if e.tenant_id is None and e.key_id})
    projects = _tenants_of_projects(session, {e.project_id for e in events if e.tenant_id is None and e.project_id})
    for e in events:
        event_id = new_id("evt")
        tenant_id = e.tenant_id or tenants.get(e.key_id or "") or projects.get(e.project_id or "")
        data = {**e.data(), "tenant_id": tenant_id}
        row = {
            "id": event_id,
            "kind": str(e.kind),
            "dedupe_key": e.dedupe_key,
            "tenant_id": tenant_id,
            "key_id": e.key_id,
            "body": body_of(event_id, str(e.kind), now, data),
            "created_at": now,
            "fanned_out": False,
        }
        stmt = insert(AlertEventRow).values(**row).on_conflict_do_nothing(index_elements=["dedupe_key"])
        session.execute(stmt)


def _tenants_of_keys(session: Session, key_ids: set[str]) -> dict[str, str]:
    """A per-key limit knows only its key: the event names the key's tenant too (webhook filters)."""
    if not key_ids:
        return {}
    from loraplex.platform.keys.models import ApiKey

    rows = session.execute(select(ApiKey.id, ApiKey.tenant_id).where(ApiKey.id.in_(key_ids)))
    return {kid: tid for kid, tid in rows}


def _tenants_of_projects(session: Session, project_ids: set[str]) -> dict[str, str]:
    """A project's rate limit knows only its project: the event names the project's tenant too."""
    if not project_ids:
        return {}
    from loraplex.platform.projects.models import Project

    rows = session.execute(select(Project.id, Project.tenant_id).where(Project.id.in_(project_ids)))
    return {pid: tid for pid, tid in rows}
