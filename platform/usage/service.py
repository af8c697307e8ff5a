from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from sqlalchemy.orm import Session

from loraplex.platform.errors import BadRequest
from loraplex.platform.tenants.service import get_tenant
from loraplex.platform.usage import repository
from loraplex.platform.usage.schemas import UsageBucket, UsageReport


def report(
    session: Session,
    *,
    group_by: str,
    tenant_id: str | None,
    since: datetime | None,
    until: datetime | None,
) -> UsageReport:
    if since is not None and until is not None and since >= until:
        raise BadRequest("since must be earlier than until", param="since")
    if tenant_id is not None:
        get_tenant(session, tenant_id, include_deleted=True)  # history outlives the tenant
    rows = repository.aggregate(session, group_by=group_by, tenant_id=tenant_id, since=since, until=until)
    data = [
        UsageBucket(
            key=str(key),
            requests=n,
            errors=int(err or 0),
            prompt_tokens=int(p),
            completion_tokens=int(c),
            total_tokens=int(p) + int(c),
        )
        for key, n, err, p, c in rows
    ]
    totals = UsageBucket(
        key="total",
        requests=sum(b.requests for b in data),
        errors=sum(b.errors for b in data),
        prompt_tokens=sum(b.prompt_tokens for b in data),
        completion_tokens=sum(b.completion_tokens for b in data),
        total_tokens=sum(b.total_tokens for b in data),
    )
    return UsageReport(group_by=group_by, tenant_id=tenant_id, data=data, totals=totals)


EXPORT_FIELDS = (
    "request_id",
    "http_request_id",
    "created_at",
    "updated_at",
    "tenant_id",
    "api_key_id",
    "project_id",
    "adapter_id",
    "adapter_name",
    "endpoint",
    "user",
    "prompt_tokens",
    "completion_tokens",
    "ttft_ms",
    "latency_ms",
    "status",
)


def check_window(session: Session, *, tenant_id: str | None, since: datetime | None, until: datetime | None) -> None:
    if since is not None and until is not None and since >= until:
        raise BadRequest("since must be earlier than until", param="since")
    if tenant_id is not None:
        get_tenant(session, tenant_id, include_deleted=True)


def export_rows(
    session: Session, *, tenant_id: str | None, since: datetime | None, until: datetime | None
) -> Iterator[dict]:
    """Every record in the window as a plain dict (what the CSV / JSON lines export writes)."""
    for r in repository.iter_records(session, tenant_id=tenant_id, since=since, until=until):
        row = {f: getattr(r, f) for f in EXPORT_FIELDS}
        row["created_at"] = r.created_at.isoformat()
        row["updated_at"] = r.updated_at.isoformat()
        yield row
