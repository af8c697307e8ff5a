from __future__ import annotations

import json

from sqlalchemy.orm import Session

from loraplex.platform.admin.sso.redact import url_origin
from loraplex.platform.alerts import repository
from loraplex.platform.alerts.models import AlertWebhook
from loraplex.platform.alerts.schemas import AlertEventOut, DeliveryOut, WebhookIn
from loraplex.platform.alerts.urls import Resolver, check_url, system_resolver
from loraplex.platform.audit import service as audit
from loraplex.platform.auth.admin import Actor
from loraplex.platform.db.base import new_id
from loraplex.platform.errors import NotFound, Unprocessable
from loraplex.platform.settings import AlertSettings
from loraplex.platform.tenants.service import get_tenant


def _public(hook: AlertWebhook) -> dict:
    """What the audit log keeps: the URL's origin only (a viewer reads the audit log, and a
    receiver's path is often its credential)."""
    url = url_origin(hook.url)
    return {"id": hook.id, "url": url, "events": list(hook.events or []), "tenant_id": hook.tenant_id}


def create_webhook(
    session: Session, settings: AlertSettings, actor: Actor, body: WebhookIn, resolver: Resolver = system_resolver
) -> AlertWebhook:
    check_url(body.url, settings, resolver=resolver)
    if body.tenant_id is not None:
        get_tenant(session, body.tenant_id)
    repository.lock_webhooks(session)  # counted, then added: one registration at a time
    _check_caps(session, settings, body.tenant_id)
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


def _check_caps(session: Session, settings: AlertSettings, tenant_id: str | None) -> None:
    """422 past ``alerts.max_webhooks_per_tenant`` (a tenant's own webhooks),
    ``alerts.max_operator_webhooks`` (those for every tenant) or ``alerts.max_fanout_per_event``
    (the webhooks one event would go to: the operator's plus its tenant's): each webhook is a POST
    per event, so the caps bound what one limit crossing makes the server send (docs/limits.md)."""
    operator, per_tenant = repository.webhook_counts(session)
    if tenant_id is None:
        if operator + 1 > settings.max_operator_webhooks:
            raise Unprocessable(
                f"at most {settings.max_operator_webhooks} webhooks for every tenant (alerts.max_operator_webhooks)",
                param="tenant_id",
                code="too_many_webhooks",
            )
        fanout = operator + 1 + max(per_tenant.values(), default=0)
    else:
        own = per_tenant.get(tenant_id, 0)
        if own + 1 > settings.max_webhooks_per_tenant:
            raise Unprocessable(
                f"tenant {tenant_id} has {own} webhooks, the most allowed (alerts.max_webhooks_per_tenant)",
                param="tenant_id",
                code="too_many_webhooks",
            )
        fanout = operator + own + 1
    if fanout > settings.max_fanout_per_event:
        raise Unprocessable(
            f"an event would go to {fanout} webhooks, more than alerts.max_fanout_per_event "
            f"({settings.max_fanout_per_event})",
            param="tenant_id",
            code="too_many_webhooks",
        )


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
