"""A tenant's quota consumption right now: the limiter's sliding minute and the token budget's
period so far (usage records, queued ones included)."""

from __future__ import annotations

from datetime import datetime, timezone

from fastapi import APIRouter
from pydantic import BaseModel

from loraplex.platform.deps import AdminDep, ContextDep, SessionDep
from loraplex.platform.quotas import service
from loraplex.platform.quotas.store import period_start
from loraplex.platform.usage.repository import tokens_since

router = APIRouter(prefix="/tenants/{tenant_id}/quota", tags=["quotas"])


class QuotaConsumption(BaseModel):
    rpm: int | None
    tpm: int | None
    max_concurrent: int | None
    token_budget: int | None
    budget_period: str
    requests_last_minute: int
    tokens_last_minute: int
    running: int
    budget_used: int
    period_start: datetime


@router.get("/consumption", response_model=QuotaConsumption)
def consumption(tenant_id: str, session: SessionDep, ctx: ContextDep, _actor: AdminDep) -> QuotaConsumption:
    q = service.get_quota(session, tenant_id)
    now = ctx.quotas.usage_now(tenant_id)
    start = period_start(q.budget_period, datetime.now(timezone.utc))
    ctx.ledger.flush()
    return QuotaConsumption(
        rpm=q.rpm,
        tpm=q.tpm,
        max_concurrent=q.max_concurrent,
        token_budget=q.token_budget,
        budget_period=q.budget_period,
        budget_used=tokens_since(session, tenant_id, start),
        period_start=start,
        **now,
    )
