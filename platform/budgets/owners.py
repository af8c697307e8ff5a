"""Who a budget belongs to, and which budgets a request is charged against: the one place that
knows the scopes (tenant, project, key). An archived project's budget reads as "project not found"
(its keys are refused before admission anyway)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from loraplex.platform.auth.key_cache import TenantAuth
from loraplex.platform.errors import NotFound
from loraplex.platform.projects import repository as projects_repo

SCOPES = ("tenant", "project", "key")


def owner_tenant(session: Session, scope: str, scope_id: str) -> str:
    """The tenant that owns ``scope_id`` (a 404 naming the scope when there is none)."""
    if scope == "tenant":
        from loraplex.platform.tenants.service import get_tenant

        return get_tenant(session, scope_id).id
    if scope == "key":
        from loraplex.platform.keys.models import ApiKey

        key = session.get(ApiKey, scope_id)
        if key is None or key.deleted_at is not None:
            raise NotFound(f"no API key with id {scope_id!r}", param="key_id")
        return key.tenant_id
    if scope == "project":
        tenant_id = _project_tenant(session, scope_id)
        if tenant_id is None:
            raise NotFound("project not found", param="project_id")
        return tenant_id
    raise NotFound(f"unknown budget scope {scope!r}")


def _project_tenant(session: Session, project_id: str) -> str | None:
    """The project's tenant, or None for an unknown or archived project (its budget is not set)."""
    row = projects_repo.get(session, project_id)
    if row is None or row.archived_at is not None:
        return None
    return str(row.tenant_id)


def request_scopes(auth: TenantAuth) -> list[tuple[str, str]]:
    """The budgets a request of this key is charged against: its key, its project, its tenant.
    Sorted: every transaction locks budget rows in this order (no deadlocks)."""
    scopes = [("tenant", auth.tenant_id), ("key", auth.key_id)]
    if auth.project is not None:
        scopes.append(("project", auth.project.project_id))
    return sorted((s, i) for s, i in scopes if i)
