"""Tenant API key → tenant, through a brief cache that revocation clears."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from loraplex.platform.auth.key_cache import TenantAuth
from loraplex.platform.db.base import utcnow
from loraplex.platform.db.session import unit_of_work
from loraplex.platform.errors import Forbidden, Unauthorized
from loraplex.platform.keys import repository as keys_repo
from loraplex.platform.projects import repository as projects_repo
from loraplex.platform.projects.scope import ProjectAuth
from loraplex.platform.tenants import repository as tenants_repo

if TYPE_CHECKING:  # the context is built above every service; only its type is needed here
    from loraplex.platform.context import PlatformContext


def lookup_tenant_key(session: Session, ctx: PlatformContext, key_hash: str) -> TenantAuth | None:
    """A usable key's tenant (not revoked, not expired), or None. Records last use."""
    key = keys_repo.get_by_hash(session, key_hash)
    if key is None or key.revoked_at is not None:
        return None
    now = utcnow()
    if key.expires_at is not None and key.expires_at <= now:
        return None
    tenant = tenants_repo.get(session, key.tenant_id)
    if tenant is None:
        return None
    key.last_used_at = now
    auth = TenantAuth(
        tenant.id,
        tenant.name,
        key.id,
        tenant.status,
        tenant.priority,
        tenant.weight,
        allowed_models=tuple(key.allowed_models) if key.allowed_models is not None else None,
        key_rpm=key.rpm,
        key_tpm=key.tpm,
        key_max_concurrent=key.max_concurrent,
        project=_project_auth(session, key.project_id),
    )
    ttl = (key.expires_at - now).total_seconds() if key.expires_at else None
    ctx.key_cache.put(key_hash, auth, ttl)
    return auth


def _project_auth(session: Session, project_id: str | None) -> ProjectAuth | None:
    project = projects_repo.get(session, project_id) if project_id else None
    if project is None:
        return None
    return ProjectAuth(
        project.id,
        project.name,
        project.archived_at is not None,
        rpm=project.rpm,
        tpm=project.tpm,
        max_concurrent=project.max_concurrent,
        allowed_models=tuple(project.allowed_models) if project.allowed_models is not None else None,
        priority=project.priority,
        weight=project.weight,
    )


def authenticate_tenant(ctx: PlatformContext, token: str) -> TenantAuth:
    key_hash = ctx.hasher.hash(token)
    auth = ctx.key_cache.get(key_hash)
    if auth is None:
        with unit_of_work(ctx.sessions) as session:
            auth = lookup_tenant_key(session, ctx, key_hash)
    if auth is None:
        raise Unauthorized("invalid, revoked or expired API key")
    if auth.tenant_status != "active":
        raise Forbidden(f"tenant {auth.tenant_name!r} is {auth.tenant_status}", code="tenant_suspended")
    if auth.project is not None and auth.project.archived:
        raise Forbidden(f"this API key's project {auth.project.name!r} is archived", code="project_archived")
    return auth
