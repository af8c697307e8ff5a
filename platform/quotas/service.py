from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from loraplex.platform.audit import service as audit
from loraplex.platform.auth.admin import Actor
from loraplex.platform.db.snapshot import snapshot
from loraplex.platform.quotas import repository
from loraplex.platform.quotas.models import Quota
from loraplex.platform.tenants.service import get_tenant

if TYPE_CHECKING:  # the context is built above every service; only its type is needed here
    from loraplex.platform.context import PlatformContext


def get_quota(session: Session, tenant_id: str) -> Quota:
    get_tenant(session, tenant_id)
    return repository.get(session, tenant_id) or Quota(tenant_id=tenant_id, budget_period="month")


def put_quota(session: Session, ctx: PlatformContext, actor: Actor, tenant_id: str, values: dict) -> Quota:
    from loraplex.platform.engine_sync import push_tenant_after_commit

    tenant = get_tenant(session, tenant_id)
    quota = repository.get(session, tenant_id)
    before = snapshot(quota) if quota else None
    if quota is None:
        quota = Quota(tenant_id=tenant_id)
        session.add(quota)
    for field, value in values.items():
        setattr(quota, field, value)
    session.flush()
    audit.record(session, actor.name, "quota.put", "tenant", tenant_id, before, snapshot(quota))
    push_tenant_after_commit(session, ctx.engine, tenant)
    return quota
