from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from loraplex.platform.projects.models import Project


def get(session: Session, project_id: str) -> Project | None:
    return session.get(Project, project_id)


def get_by_name(session: Session, tenant_id: str, name: str) -> Project | None:
    return session.scalar(select(Project).where(Project.tenant_id == tenant_id, Project.name == name))


def list_for_tenant(session: Session, tenant_id: str, *, include_archived: bool) -> list[Project]:
    stmt = select(Project).where(Project.tenant_id == tenant_id)
    if not include_archived:
        stmt = stmt.where(Project.archived_at.is_(None))
    return list(session.scalars(stmt.order_by(Project.created_at, Project.id)))


def list_active(session: Session) -> list[Project]:
    return list(session.scalars(select(Project).where(Project.archived_at.is_(None))))


def add(session: Session, project: Project) -> None:
    session.add(project)
    session.flush()
