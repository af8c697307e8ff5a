"""Projects: create, list, change and archive; the check a key's ``project_id`` must pass."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from loraplex.platform.audit import service as audit
from loraplex.platform.auth.admin import Actor
from loraplex.platform.db.base import utcnow
from loraplex.platform.db.session import on_commit
from loraplex.platform.db.snapshot import snapshot
from loraplex.platform.errors import Conflict, NotFound
from loraplex.platform.keys import repository as keys_repo
from loraplex.platform.projects import repository
from loraplex.platform.projects.models import Project
from loraplex.platform.tenants.service import get_tenant

if TYPE_CHECKING:  # the context is built above every service; only its type is needed here
    from loraplex.platform.context import PlatformContext


def get_project(session: Session, project_id: str) -> Project:
    project = repository.get(session, project_id)
    if project is None:
        raise NotFound(f"no project with id {project_id!r}", param="project_id")
    get_tenant(session, project.tenant_id)  # a deleted tenant's projects are gone with it
    return project


def create_project(
    session: Session, ctx: PlatformContext, actor: Actor, tenant_id: str, fields: dict[str, Any]
) -> Project:
    get_tenant(session, tenant_id)
    _check_name(session, tenant_id, fields["name"])
    project = Project(tenant_id=tenant_id)
    _apply(project, fields)
    repository.add(session, project)
    audit.record(session, actor.name, "project.create", "project", project.id, None, snapshot(project))
    return project


def list_projects(session: Session, tenant_id: str, *, include_archived: bool) -> list[Project]:
    get_tenant(session, tenant_id)
    return repository.list_for_tenant(session, tenant_id, include_archived=include_archived)


def update_project(
    session: Session, ctx: PlatformContext, actor: Actor, project_id: str, changes: dict[str, Any]
) -> Project:
    project = get_project(session, project_id)
    if project.archived_at is not None:
        raise Conflict(f"project {project_id!r} is archived", code="project_archived", param="project_id")
    name = changes.get("name")
    if name is not None and name != project.name:
        _check_name(session, project.tenant_id, name)
    before = snapshot(project)
    _apply(project, changes)
    session.flush()
    audit.record(session, actor.name, "project.update", "project", project.id, before, snapshot(project))
    _keys_changed(session, ctx, project.tenant_id)
    return project


def archive_project(session: Session, ctx: PlatformContext, actor: Actor, project_id: str) -> Project:
    """Archive (the row stays: usage records name it): its keys are refused from the next request
    and its requests in flight stop."""
    project = get_project(session, project_id)
    if project.archived_at is not None:
        raise Conflict(f"project {project_id!r} is already archived", code="project_archived", param="project_id")
    before = snapshot(project)
    project.archived_at = utcnow()
    session.flush()
    audit.record(session, actor.name, "project.archive", "project", project.id, before, snapshot(project))
    _keys_changed(session, ctx, project.tenant_id)
    key_ids = [k.id for k in keys_repo.list_for_tenant(session, project.tenant_id) if k.project_id == project.id]
    reason = f"project {project.id} was archived"
    on_commit(session, lambda: [ctx.inflight.abort(ctx.engine, reason, key_id=k) for k in key_ids])
    return project


def check_for_key(session: Session, tenant_id: str, project_id: str) -> Project:
    """A new key's project: one of the key's tenant's, not archived. Another tenant's project is
    answered like a missing one (404), so a tenant admin learns nothing of other tenants."""
    project = repository.get(session, project_id)
    if project is None or project.tenant_id != tenant_id:
        raise NotFound(f"tenant {tenant_id!r} has no project with id {project_id!r}", param="project_id")
    if project.archived_at is not None:
        raise Conflict(f"project {project_id!r} is archived", code="project_archived", param="project_id")
    return project


def _check_name(session: Session, tenant_id: str, name: str) -> None:
    existing = repository.get_by_name(session, tenant_id, name)
    if existing is not None:
        note = " (archived; its name stays reserved for its usage history)" if existing.archived_at else ""
        raise Conflict(f"this tenant already has a project named {name!r}{note}", param="name")


def _apply(project: Project, fields: dict[str, Any]) -> None:
    for field, value in fields.items():
        if field == "models":
            project.allowed_models = None if value is None else sorted(set(value))
        else:
            setattr(project, field, value)


def _keys_changed(session: Session, ctx: PlatformContext, tenant_id: str) -> None:
    # A key's cached auth carries its project's limits and state: drop the tenant's now and again
    # after the commit, so no lookup racing the commit re-caches the old project.
    ctx.key_cache.evict_tenant(tenant_id)
    on_commit(session, lambda: ctx.key_cache.evict_tenant(tenant_id))
