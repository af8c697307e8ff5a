from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Query, UploadFile, status
from fastapi.routing import APIRoute
from starlette.routing import Match

from loraplex.platform.adapters import references, service
from loraplex.platform.adapters.models import Adapter
from loraplex.platform.adapters.schemas import AdapterList, AdapterOut, GrantIn, GrantOut, RegisterByReference
from loraplex.platform.deps import AdminDep, ContextDep, SessionDep
from loraplex.platform.tenants.schemas import Deleted

router = APIRouter(prefix="/adapters", tags=["adapters"])


def _out(adapter: Adapter, grants: list[str]) -> AdapterOut:
    return AdapterOut.model_validate(adapter).model_copy(update={"granted_tenant_ids": grants})


class JsonBodyRoute(APIRoute):
    """Matches only requests with a JSON body, so ``POST /adapters`` takes a JSON reference and
    the multipart upload (the next route on the same path) stays exactly as it was."""

    def matches(self, scope):
        match, child = super().matches(scope)
        if match is Match.FULL:
            ctype = dict(scope.get("headers") or []).get(b"content-type", b"")
            if not ctype.split(b";")[0].strip().lower().endswith(b"json"):
                return Match.NONE, {}
        return match, child


def register_by_reference(
    body: RegisterByReference, session: SessionDep, ctx: ContextDep, actor: AdminDep
) -> AdapterOut:
    """Register an adapter where it lives: ``source`` is ``s3://bucket/prefix/``, ``file:///abs/path``
    or ``hf://org/repo[@revision]``. The files are fetched and validated now (the upload's checks);
    each engine fetches them again on first use into its disk cache."""
    req = service.UploadRequest(
        name=body.name, visibility=body.visibility, tenant_id=body.tenant_id or None, new_version=body.new_version
    )
    adapter = references.register_reference(session, ctx, actor, req, body.source)
    return _out(adapter, service.granted_tenant_ids(session, [adapter])[adapter.id])


router.add_api_route(
    "",
    register_by_reference,
    methods=["POST"],
    status_code=status.HTTP_201_CREATED,
    response_model=AdapterOut,
    route_class_override=JsonBodyRoute,
    summary="Register an adapter by reference (JSON body)",
)


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
    against the base model, stored by content hash and served at once, without a restart.
    With a JSON body ``{"name", "source", "tenant_id", "visibility"}`` instead, the adapter is
    registered by reference (s3://, file://, hf://) and fetched on first use."""
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


@router.post("/{adapter_id}/refresh", response_model=AdapterOut)
def refresh_adapter(adapter_id: str, session: SessionDep, ctx: ContextDep, actor: AdminDep) -> AdapterOut:
    """By-reference adapters: fetch the source again; new content is registered as a new version
    (returned), the same content returns this version unchanged."""
    adapter = service.get_adapter(session, adapter_id)
    if not adapter.source_uri:
        from loraplex.platform.errors import BadRequest

        raise BadRequest("only adapters registered by reference can be refreshed", param="adapter_id")
    current = references.refresh(session, ctx, actor, adapter)
    return _out(current, service.granted_tenant_ids(session, [current])[current.id])


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
