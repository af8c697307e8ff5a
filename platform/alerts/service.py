from __future__ import annotations

import json

from sqlalchemy.orm import Session

from loraplex.platform.alerts import repository
from loraplex.platform.alerts.models import AlertWebhook
from loraplex.platform.alerts.schemas import AlertEventOut, DeliveryOut, WebhookIn
from loraplex.platform.alerts.urls import check_url
from loraplex.platform.audit import service as audit
from loraplex.platform.auth.admin import Actor
from loraplex.platform.db.base import new_id
from loraplex.platform.errors import NotFound
from loraplex.platform.settings import AlertSettings
from loraplex.platform.tenants.service import get_tenant


def _public(hook: AlertWebhook) -> dict:
    return {"id": hook.id, "url": hook.url, "events": list(hook.events or []), "tenant_id": hook.tenant_id}


def create_webhook(session: Session, settings: AlertSettings, actor: Actor, body: WebhookIn) -> AlertWebhook:
    check_url(body.url, settings)
    if body.tenant_id is not None:
        get_tenant(session, body.tenant_id)
    hook = AlertWebhook(
        id=new_id("whk"),
        url=body.url,
        secret=body.secret,
        events=[str(e) for e in dict.fromkeys(body.events)],
        tenant_id=body.tenant_id,
    )
    session.add(hook)
    session.flush()
    audit.record(session, actor.name, "webhook.create", "webhook", hook.id, None, _public(hook))
    return hook


def delete_webhook(session: Session, actor: Actor, webhook_id: str) -> None:
    hook = session.get(AlertWebhook, webhook_id)
    if hook is None:
        raise NotFound(f"no webhook with id {webhook_id!r}", param="webhook_id")
    before = _public(hook)
    repository.delete_webhook(session, webhook_id)
    audit.record(session, actor.name, "webhook.delete", "webhook", webhook_id, before, None)


def list_events(session: Session, limit: int, tenant_id: str | None, kind: str | None) -> list[AlertEventOut]:
    events = repository.list_events(session, limit, tenant_id, kind)
    by_event: dict[str, list[DeliveryOut]] = {e.id: [] for e in events}
    for d in repository.deliveries_of(session, list(by_event)):
        by_event[d.event_id].append(DeliveryOut.model_validate(d))
    return [
        AlertEventOut(
            id=e.id,
            type=e.kind,
            tenant_id=e.tenant_id,
            key_id=e.key_id,
            created_at=e.created_at,
            data=json.loads(e.body)["data"],
            state="fanned_out" if e.fanned_out else "pending",
            deliveries=by_event[e.id],
        )
        for e in events
    ]
