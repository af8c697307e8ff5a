from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from loraplex.platform.audit.models import AuditEntry


def add(session: Session, entry: AuditEntry) -> None:
    session.add(entry)


def list_entries(
    session: Session, *, target_id: str | None, action: str | None, limit: int, offset: int = 0
) -> list[AuditEntry]:
    stmt = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit).offset(offset)
    if target_id:
        stmt = stmt.where(AuditEntry.target_id == target_id)
    if action:
        stmt = stmt.where(AuditEntry.action == action)
    return list(session.scalars(stmt))
