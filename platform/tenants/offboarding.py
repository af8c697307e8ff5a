"""Deleting a tenant: one use case across three domains.

Soft delete: the tenant row, its keys and its adapters stay as history (usage reports still show
them) but disappear from the APIs; keys stop working; in-flight requests are stopped. Its stored
responses (its users' conversations, not history) are deleted. It lives
here, above the three services, so that none of them imports another's: adapters and keys look a
tenant up through ``tenants.service``; ``tenants.service`` knows nothing of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from loraplex.platform.adapters import service as adapters_service
from loraplex.platform.auth.admin import Actor
from loraplex.platform.inference.responses_api import store as responses_store
from loraplex.platform.keys import service as keys_service
from loraplex.platform.tenants import service as tenants_service

if TYPE_CHECKING:  # the context is built above every service; only its type is needed here
    from loraplex.platform.context import PlatformContext


def delete_tenant(session: Session, ctx: PlatformContext, actor: Actor, tenant_id: str) -> None:
    tenant = tenants_service.get_tenant(session, tenant_id)
    for adapter in adapters_service.owned_by(session, tenant_id):
        adapters_service.delete_adapter(session, ctx, actor, adapter.id)
    adapters_service.drop_grants_of_tenant(session, tenant_id)
    keys_service.delete_keys_of_tenant(session, tenant_id)
    responses_store.remove_tenant(session, tenant_id)
    tenants_service.mark_deleted(session, ctx, actor, tenant)
