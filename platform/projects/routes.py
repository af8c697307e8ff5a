from __future__ import annotations

from fastapi import APIRouter, status

from loraplex.platform.deps import AdminDep, ContextDep, SessionDep
from loraplex.platform.projects import service
from loraplex.platform.projects.schemas import ProjectCreate, ProjectList, ProjectOut, ProjectUpdate

router = APIRouter(tags=["projects"])


@router.post("/tenants/{tenant_id}/projects", status_code=status.HTTP_201_CREATED, response_model=ProjectOut)
def create_project(
    tenant_id: str, body: ProjectCreate, session: SessionDep, ctx: ContextDep, actor: AdminDep
) -> ProjectOut:
    """A project of the tenant: keys created with its ``project_id`` get its limits (on top of the
    tenant's), its model allowlist (inside the tenant's) and its share of the tenant's fair share."""
    project = service.create_project(session, ctx, actor, tenant_id, body.model_dump())
    return ProjectOut.model_validate(project)


@router.get("/tenants/{tenant_id}/projects", response_model=ProjectList)
def list_projects(tenant_id: str, session: SessionDep, _actor: AdminDep, include_archived: bool = False) -> ProjectList:
    projects = service.list_projects(session, tenant_id, include_archived=include_archived)
    return ProjectList(data=[ProjectOut.model_validate(p) for p in projects])


@router.get("/projects/{project_id}", response_model=ProjectOut)
def get_project(project_id: str, session: SessionDep, _actor: AdminDep) -> ProjectOut:
    return ProjectOut.model_validate(service.get_project(session, project_id))


@router.patch("/projects/{project_id}", response_model=ProjectOut)
def update_project(
    project_id: str, body: ProjectUpdate, session: SessionDep, ctx: ContextDep, actor: AdminDep
) -> ProjectOut:
    """Change the fields sent (a limit or ``models`` sent as null is cleared); applies from each
    key's next request."""
    changes = body.model_dump(exclude_unset=True)
    return ProjectOut.model_validate(service.update_project(session, ctx, actor, project_id, changes))


@router.delete("/projects/{project_id}", response_model=ProjectOut)
def archive_project(project_id: str, session: SessionDep, ctx: ContextDep, actor: AdminDep) -> ProjectOut:
    """Archive the project: its keys are refused (403 ``project_archived``) and its requests in
    flight stop; the row stays, so usage and spend still name it."""
    return ProjectOut.model_validate(service.archive_project(session, ctx, actor, project_id))
