from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from pydantic import AfterValidator, AwareDatetime

from loraplex.platform.db.session import unit_of_work
from loraplex.platform.deps import AdminDep, ContextDep, SessionDep
from loraplex.platform.usage import service
from loraplex.platform.usage.csv_cells import safe_row
from loraplex.platform.usage.schemas import GroupBy, UsageReport

router = APIRouter(tags=["usage"])


def _in_utc(value: datetime | None) -> datetime | None:
    """The database compares in UTC: a time that has no UTC equivalent (year 9999 at -23:00) is a 422."""
    if value is None:
        return None
    try:
        return value.astimezone(timezone.utc)
    except OverflowError:
        raise ValueError("the time is out of range once converted to UTC") from None


Since = Annotated[AwareDatetime | None, AfterValidator(_in_utc), Query(description="Inclusive, with a time zone")]
Until = Annotated[AwareDatetime | None, AfterValidator(_in_utc), Query(description="Exclusive, with a time zone")]


@router.get("/usage", response_model=UsageReport)
def usage(
    session: SessionDep,
    _actor: AdminDep,
    tenant_id: str | None = None,
    since: Since = None,
    until: Until = None,
    group_by: GroupBy = "day",
) -> UsageReport:
    """Requests, errors and tokens in/out, per hour, per day or per adapter (deleted tenants,
    keys and adapters included: usage is history)."""
    return service.report(session, group_by=group_by, tenant_id=tenant_id, since=since, until=until)


@router.get(
    "/usage/export",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "Every record in the window, as CSV or JSON lines",
            "content": {
                "text/csv": {"schema": {"type": "string"}},
                "application/x-ndjson": {"schema": {"type": "string"}},
            },
        }
    },
)
def export_usage(
    ctx: ContextDep,
    session: SessionDep,
    _actor: AdminDep,
    format: Literal["csv", "jsonl"] = "csv",
    tenant_id: str | None = None,
    since: Since = None,
    until: Until = None,
) -> StreamingResponse:
    """Every usage record in the window, one per line, as CSV (with a header) or JSON lines."""
    service.check_window(session, tenant_id=tenant_id, since=since, until=until)  # 4xx before streaming
    try:  # records still queued (checkpoints, dropped quota holds) are part of the history
        ctx.ledger.flush()
    except TimeoutError:  # a backlog: export what is on record now
        pass

    def lines() -> Iterator[str]:
        # Its own session: the request's session is closed once the response starts streaming.
        with unit_of_work(ctx.sessions) as s:
            rows = service.export_rows(s, tenant_id=tenant_id, since=since, until=until)
            if format == "jsonl":
                for row in rows:
                    yield json.dumps(row) + "\n"
                return
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=service.EXPORT_FIELDS)
            writer.writeheader()
            for row in rows:
                writer.writerow(safe_row(row))  # no spreadsheet formulas (csv_cells.py)
                if buf.tell() > 64 * 1024:
                    yield buf.getvalue()
                    buf.seek(0)
                    buf.truncate()
            yield buf.getvalue()

    media = "text/csv" if format == "csv" else "application/x-ndjson"
    name = f"usage.{format}"
    return StreamingResponse(
        lines(), media_type=media, headers={"content-disposition": f'attachment; filename="{name}"'}
    )
