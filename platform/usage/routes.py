from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import AwareDatetime

from loraplex.platform.deps import AdminDep, SessionDep
from loraplex.platform.usage import service
from loraplex.platform.usage.schemas import GroupBy, UsageReport

router = APIRouter(tags=["usage"])


@router.get("/usage", response_model=UsageReport)
def usage(
    session: SessionDep,
    _actor: AdminDep,
    tenant_id: str | None = None,
    since: Annotated[AwareDatetime | None, Query(description="Inclusive, with a time zone")] = None,
    until: Annotated[AwareDatetime | None, Query(description="Exclusive, with a time zone")] = None,
    group_by: GroupBy = "day",
) -> UsageReport:
    """Requests, errors and tokens in/out, per hour, per day or per adapter."""
    return service.report(session, group_by=group_by, tenant_id=tenant_id, since=since, until=until)
