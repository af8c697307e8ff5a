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
    target_id: Annotated[str | None, Query(max_length=64)] = None,
    action: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,  # as every admin list (larger overflows SQL)
) -> AuditList:
    """Most recent changes first; ``offset`` skips that many (it was ignored: a client paging with
    it got the first page again and again)."""
    rows = service.list_entries(session, target_id=target_id, action=action, limit=limit, offset=offset)
    return AuditList(data=[AuditEntryOut.model_validate(r) for r in rows])
