"""Usage over time, one series per tenant or per adapter (the admin page's charts)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from loraplex.platform.deps import AdminDep, SessionDep
from loraplex.platform.usage.models import UsageRecord
from loraplex.platform.usage.repository import _bucket
from loraplex.platform.usage.routes import Since, Until

router = APIRouter(tags=["usage"])


class SeriesPoint(BaseModel):
    time: str
    key: str  # tenant id, or adapter name ("" = the base model)
    requests: int
    prompt_tokens: int
    completion_tokens: int


class UsageSeries(BaseModel):
    bucket: Literal["hour", "day"]
    by: Literal["tenant", "adapter"]
    data: list[SeriesPoint]


def series(
    session: Session, bucket: str, by: str, tenant_id: str | None, since: datetime | None, until: datetime | None
) -> list[SeriesPoint]:
    t = _bucket(session, bucket).label("t")
    key = (UsageRecord.tenant_id if by == "tenant" else func.coalesce(UsageRecord.adapter_name, "")).label("k")
    stmt = (
        select(
            t,
            key,
            func.count(),
            func.coalesce(func.sum(UsageRecord.prompt_tokens), 0),
            func.coalesce(func.sum(UsageRecord.completion_tokens), 0),
        )
        .group_by(t, key)
        .order_by(t, key)
    )
    if tenant_id is not None:
        stmt = stmt.where(UsageRecord.tenant_id == tenant_id)
    if since is not None:
        stmt = stmt.where(UsageRecord.created_at >= since)
    if until is not None:
        stmt = stmt.where(UsageRecord.created_at < until)
    return [
        SeriesPoint(time=r[0], key=r[1], requests=r[2], prompt_tokens=r[3], completion_tokens=r[4])
        for r in session.execute(stmt)
    ]


@router.get("/usage/series", response_model=UsageSeries)
def usage_series(
    session: SessionDep,
    _actor: AdminDep,
    bucket: Literal["hour", "day"] = "hour",
    by: Literal["tenant", "adapter"] = "tenant",
    tenant_id: str | None = None,
    since: Since = None,  # the report's validated bounds: a time with no UTC equivalent is a 422, not a 500
    until: Until = None,
) -> UsageSeries:
    """Requests and tokens per time bucket, one series per tenant or per adapter."""
    return UsageSeries(bucket=bucket, by=by, data=series(session, bucket, by, tenant_id, since, until))
