"""The audit trail: every change made through the admin API or the CLI, with before/after."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from loraplex.platform.audit import repository
from loraplex.platform.audit.models import AuditEntry


def record(
    session: Session,
    actor: str,
    action: str,
    target_type: str,
    target_id: str,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> None:
    repository.add(
        session,
        AuditEntry(
            actor=actor,
            action=action,
            target_type=target_type,
            target_id=target_id,
            before=before,
            after=after,
        ),
    )


def list_entries(
    session: Session, *, target_id: str | None = None, action: str | None = None, limit: int = 100, offset: int = 0
) -> list[AuditEntry]:
    return repository.list_entries(session, target_id=target_id, action=action, limit=limit, offset=offset)
