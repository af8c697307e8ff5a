from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

from loraplex.platform.deps import AdminDep, ContextDep, SessionDep
from loraplex.platform.tenants import offboarding, service
from loraplex.platform.tenants.schemas import Deleted, TenantCreate, TenantList, TenantOut, TenantUpdate

router = APIRouter(prefix="/tenants", tags=["tenants"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=TenantOut)
def create_tenant(body: TenantCreate, session: SessionDep, ctx: ContextDep, actor: AdminDep) -> TenantOut:
    return TenantOut.model_validate(service.create_tenant(session, ctx, actor, **body.model_dump()))


@router.get("", response_model=TenantList)
def list_tenants(
    session: SessionDep,
    _actor: AdminDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> TenantList:
    rows, total = service.list_tenants(session, limit=limit, offset=offset)
    return TenantList(data=[TenantOut.model_validate(t) for t in rows], total=total)


@router.get("/{tenant_id}", response_model=TenantOut)
def get_tenant(tenant_id: str, session: SessionDep, _actor: AdminDep) -> TenantOut:
    return TenantOut.model_validate(service.get_tenant(session, tenant_id))


@router.patch("/{tenant_id}", response_model=TenantOut)
def update_tenant(
    tenant_id: str, body: TenantUpdate, session: SessionDep, ctx: ContextDep, actor: AdminDep
) -> TenantOut:
    changes = body.model_dump(exclude_unset=True)
    return TenantOut.model_validate(service.update_tenant(session, ctx, actor, tenant_id, changes))


@router.delete("/{tenant_id}", response_model=Deleted)
def delete_tenant(tenant_id: str, session: SessionDep, ctx: ContextDep, actor: AdminDep) -> Deleted:
    """Soft-delete a tenant: it, its keys and its private adapters disappear from the APIs and its
    in-flight requests stop; the rows and the usage history stay (usage reports and exports show it)."""
    offboarding.delete_tenant(session, ctx, actor, tenant_id)
    return Deleted(id=tenant_id, object="tenant")
