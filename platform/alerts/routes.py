"""Admin API: webhooks (``/admin/v1/webhooks``) and the outbox with its delivery state
(``/admin/v1/alerts/events``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from loraplex.platform.admin.sso import redact
from loraplex.platform.alerts import repository, service
from loraplex.platform.alerts.events import AlertKind
from loraplex.platform.alerts.schemas import AlertEventList, WebhookIn, WebhookList, WebhookOut
from loraplex.platform.deps import AdminDep, ContextDep, SessionDep

router = APIRouter(tags=["alerts"])


@router.post("/webhooks", response_model=WebhookOut, status_code=201)
def create_webhook(body: WebhookIn, session: SessionDep, ctx: ContextDep, actor: AdminDep) -> WebhookOut:
    """Register a receiver; its secret is stored for signing and never shown again."""
    return WebhookOut.model_validate(
        service.create_webhook(session, ctx.settings.alerts, actor, body, ctx.webhook_resolver)
    )


@router.get("/webhooks", response_model=WebhookList)
def list_webhooks(session: SessionDep, actor: AdminDep) -> WebhookList:
    """Every webhook; a viewer sees each URL's origin only (its path is often a credential)."""
    hooks = [WebhookOut.model_validate(h) for h in repository.list_webhooks(session)]
    return WebhookList(data=[h.model_copy(update={"url": redact.webhook_url_for(actor, h.url)}) for h in hooks])


@router.delete("/webhooks/{webhook_id}", status_code=204)
def delete_webhook(webhook_id: str, session: SessionDep, actor: AdminDep) -> Response:
    service.delete_webhook(session, actor, webhook_id)
    return Response(status_code=204)


@router.get("/alerts/events", response_model=AlertEventList)
def list_events(
    session: SessionDep,
    _actor: AdminDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    tenant_id: Annotated[str | None, Query(max_length=40)] = None,
    type: Annotated[AlertKind | None, Query()] = None,  # noqa: A002 - the API's field name
) -> AlertEventList:
    """The newest events first, each with its deliveries (state, attempts, last error)."""
    return AlertEventList(data=service.list_events(session, limit, tenant_id, str(type) if type else None))
