from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Query, UploadFile, status

from loraplex.platform.adapters import service
from loraplex.platform.adapters.models import Adapter
from loraplex.platform.adapters.schemas import AdapterList, AdapterOut, GrantIn, GrantOut
from loraplex.platform.deps import AdminDep, ContextDep, SessionDep
from loraplex.platform.tenants.schemas import Deleted

router = APIRouter(prefix="/adapters", tags=["adapters"])


def _out(adapter: Adapter, grants: list[str]) -> AdapterOut:
    return AdapterOut.model_validate(adapter).model_copy(update={"granted_tenant_ids": grants})


@router.post("", status_code=status.HTTP_201_CREATED, response_model=AdapterOut)
def upload_adapter(
    session: SessionDep,
    ctx: ContextDep,
    actor: AdminDep,
    name: Annotated[str, Form(description="Adapter name, as tenants put it in `model`")],
    file: Annotated[UploadFile, File(description=".zip or .tar.gz of a PEFT adapter folder")],
    visibility: Annotated[str, Form()] = "private",
    tenant_id: Annotated[str | None, Form(description="Owning tenant (private adapters)")] = None,
    new_version: Annotated[bool, Form(description="Replace the served version of `name`")] = False,
) -> AdapterOut:
    """Upload a PEFT adapter (adapter_config.json + adapter_model.safetensors). It is validated
    against the base model, stored by content hash and served at once, without a restart."""
    req = service.UploadRequest(name=name, visibility=visibility, tenant_id=tenant_id or None, new_version=new_version)
    adapter = service.upload_adapter(session, ctx, actor, req, file.file)
    return _out(adapter, service.granted_tenant_ids(session, [adapter])[adapter.id])


@router.get("", response_model=AdapterList)
def list_adapters(
    session: SessionDep,
    _actor: AdminDep,
    tenant_id: Annotated[str | None, Query(description="Only adapters this tenant may use")] = None,
    include_superseded: bool = False,
) -> AdapterList:
    rows = service.list_adapters(session, tenant_id=tenant_id, include_superseded=include_superseded)
    grants = service.granted_tenant_ids(session, rows)
    return AdapterList(data=[_out(a, grants[a.id]) for a in rows])


@router.get("/{adapter_id}", response_model=AdapterOut)
def get_adapter(adapter_id: str, session: SessionDep, _actor: AdminDep) -> AdapterOut:
    adapter = service.get_adapter(session, adapter_id)
    return _out(adapter, service.granted_tenant_ids(session, [adapter])[adapter.id])


@router.delete("/{adapter_id}", response_model=Deleted)
def delete_adapter(adapter_id: str, session: SessionDep, ctx: ContextDep, actor: AdminDep) -> Deleted:
    """Soft-delete this adapter version: hidden from the APIs, its requests stopped and the engine
    drops it at once; usage history keeps its name."""
    service.delete_adapter(session, ctx, actor, adapter_id)
    return Deleted(id=adapter_id, object="adapter")


@router.post("/{adapter_id}/grants", status_code=status.HTTP_201_CREATED, response_model=GrantOut)
def add_grant(adapter_id: str, body: GrantIn, session: SessionDep, actor: AdminDep) -> GrantOut:
    """Let another tenant use a private adapter."""
    return GrantOut.model_validate(service.add_grant(session, actor, adapter_id, body.tenant_id))


@router.delete("/{adapter_id}/grants", response_model=Deleted)
def remove_grant(adapter_id: str, session: SessionDep, actor: AdminDep, tenant_id: Annotated[str, Query()]) -> Deleted:
    service.remove_grant(session, actor, adapter_id, tenant_id)
    return Deleted(id=f"{adapter_id}:{tenant_id}", object="adapter_grant")


@router.delete("/{adapter_id}/grants/{tenant_id}", response_model=Deleted, include_in_schema=False)
def remove_grant_by_path(adapter_id: str, tenant_id: str, session: SessionDep, actor: AdminDep) -> Deleted:
    service.remove_grant(session, actor, adapter_id, tenant_id)
    return Deleted(id=f"{adapter_id}:{tenant_id}", object="adapter_grant")
