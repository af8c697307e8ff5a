"""Admin: the price book and spend (``/admin/v1/prices``, ``/admin/v1/spend``)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

from fastapi import APIRouter, status
from fastapi.responses import StreamingResponse

from loraplex.platform.db.session import unit_of_work
from loraplex.platform.deps import AdminDep, ContextDep, SessionDep
from loraplex.platform.pricing import repository, service
from loraplex.platform.pricing.schemas import PriceCreate, PriceList, PriceOut, SpendGroupBy, SpendReport
from loraplex.platform.tenants.service import get_tenant
from loraplex.platform.usage.csv_cells import safe_row
from loraplex.platform.usage.routes import Since, Until

router = APIRouter(tags=["pricing"])


@router.post("/prices", status_code=status.HTTP_201_CREATED, response_model=PriceOut)
def create_price(body: PriceCreate, session: SessionDep, actor: AdminDep) -> PriceOut:
    """Add a price from ``effective_from`` (now when omitted) on. Earlier prices stay in force for
    the records served under them; a price is never edited, a change is a new price."""
    return service.price_out(service.create_price(session, actor, body))


@router.get("/prices", response_model=PriceList)
def list_prices(session: SessionDep, _actor: AdminDep, model: str | None = None) -> PriceList:
    """Every price (the history included), by model then effective_from."""
    book = service.load_book(session)
    rows = repository.list_prices(session, model)
    return PriceList(currency=book.currency, data=[service.price_out(p) for p in rows])


@router.get("/spend", response_model=SpendReport)
def spend(
    ctx: ContextDep,
    session: SessionDep,
    _actor: AdminDep,
    group_by: SpendGroupBy = "tenant",
    tenant_id: str | None = None,
    start: Since = None,
    end: Until = None,
) -> SpendReport:
    """Cost of the usage in [start, end), each record at the price in force when it was served."""
    _flush(ctx)
    return service.spend(session, group_by=group_by, tenant_id=tenant_id, start=start, end=end)


@router.get(
    "/spend/export",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "Every record with its price and cost",
            "content": {"text/csv": {"schema": {"type": "string"}}},
        }
    },
)
def export_spend(
    ctx: ContextDep,
    session: SessionDep,
    _actor: AdminDep,
    tenant_id: str | None = None,
    start: Since = None,
    end: Until = None,
) -> StreamingResponse:
    """Every usage record in [start, end) as CSV, with the price it paid and its exact cost."""
    service.check_window(start, end)  # 4xx before streaming
    if tenant_id is not None:
        get_tenant(session, tenant_id, include_deleted=True)
    _flush(ctx)

    def lines() -> Iterator[str]:
        with unit_of_work(ctx.sessions) as s:  # the request's session closes once streaming starts
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=service.EXPORT_FIELDS)
            writer.writeheader()
            for row in service.export_rows(s, tenant_id=tenant_id, start=start, end=end):
                writer.writerow(safe_row(row))  # no spreadsheet formulas (csv_cells.py)
                if buf.tell() > 64 * 1024:
                    yield buf.getvalue()
                    buf.seek(0)
                    buf.truncate()
            yield buf.getvalue()

    return StreamingResponse(
        lines(), media_type="text/csv", headers={"content-disposition": 'attachment; filename="spend.csv"'}
    )


def _flush(ctx: ContextDep) -> None:
    try:  # records still queued are part of the history a report reads
        ctx.ledger.flush()
    except TimeoutError:  # a backlog: report what is on record now
        pass
