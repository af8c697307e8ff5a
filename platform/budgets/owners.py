"""Who a budget belongs to, and which budgets a request is charged against: the one place that
knows the scopes (tenant, project, key). Projects come from the projects package when it is
installed (``_project_tenant``); until then a project budget is "project not found"."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from loraplex.platform.errors import NotFound

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
    """The project's tenant, or None. The projects package is merged separately: this is the only
    line that reads it (a ``Project`` model with ``id``, ``tenant_id`` and optional ``deleted_at``)."""
    try:
        from loraplex.platform.projects.models import Project  # type: ignore[import-not-found]
    except ImportError:
        return None
    row: Any = session.get(Project, project_id)
    if row is None or getattr(row, "deleted_at", None) is not None:
        return None
    return str(row.tenant_id)


def request_scopes(auth: Any) -> list[tuple[str, str]]:
    """The budgets a request of this key is charged against: its key, its project (once keys carry
    one), its tenant. Sorted: every transaction locks budget rows in this order (no deadlocks)."""
    scopes = [("tenant", auth.tenant_id), ("key", auth.key_id)]
    project_id = getattr(auth, "project_id", None)
    if project_id:
        scopes.append(("project", project_id))
    return sorted((s, i) for s, i in scopes if i)
