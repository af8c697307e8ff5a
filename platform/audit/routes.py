from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from loraplex.platform.audit import service
from loraplex.platform.audit.schemas import AuditEntryOut, AuditList
from loraplex.platform.deps import AdminDep, SessionDep

router = APIRouter(tags=["audit"])


@router.get("/audit", response_model=AuditList)
def audit_log(
    session: SessionDep,
    _actor: AdminDep,
    target_id: str | None = None,
    action: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> AuditList:
    """Most recent changes first."""
    rows = service.list_entries(session, target_id=target_id, action=action, limit=limit)
    return AuditList(data=[AuditEntryOut.model_validate(r) for r in rows])
