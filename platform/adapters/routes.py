from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.routing import Match

from loraplex.platform.adapters import references, service
from loraplex.platform.adapters.models import Adapter
from loraplex.platform.adapters.schemas import AdapterList, AdapterOut, GrantIn, GrantOut, RegisterByReference
from loraplex.platform.adapters.upload_stream import StagedUpload, stage_multipart
from loraplex.platform.admin.sso import redact
from loraplex.platform.auth.admin import Actor
from loraplex.platform.context import PlatformContext
from loraplex.platform.db.session import unit_of_work
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


class UploadForm(BaseModel):
    """The upload's text fields (the archive is the ``file`` part)."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(description="Adapter name, as tenants put it in `model`")
    visibility: str = "private"
    tenant_id: str | None = Field(None, description="Owning tenant (private adapters)")
    new_version: bool = Field(False, description="Replace the served version of `name`")


def _upload_request_body() -> dict:
    schema = UploadForm.model_json_schema()
    schema["properties"]["file"] = {
        "type": "string",
        "format": "binary",
        "description": ".zip or .tar.gz of a PEFT adapter folder",
    }
    schema["required"] = ["name", "file"]
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}}


@router.post("", status_code=status.HTTP_201_CREATED, response_model=AdapterOut, openapi_extra=_upload_request_body())
async def upload_adapter(request: Request, ctx: ContextDep, actor: AdminDep) -> AdapterOut:
    """Upload a PEFT adapter (adapter_config.json + adapter_model.safetensors). It is validated
    against the base model, stored by content hash and served at once, without a restart.
    With a JSON body ``{"name", "source", "tenant_id", "visibility"}`` instead, the adapter is
    registered by reference (s3://, file://, hf://) and fetched on first use.

    The body is read only now, after the admin key was checked, straight into a staging folder
    (upload_stream.py): nothing of it is kept in memory or in the system temp folder."""
    with ctx.store.staging() as folder:
        staged = await stage_multipart(
            request.headers.get("content-type", ""),
            request.stream(),
            folder,
            max_file_bytes=ctx.settings.uploads.max_upload_bytes,
        )
        form = _validated(staged)
        assert staged.file is not None  # _validated refused a form without one
        return await run_in_threadpool(_store_upload, ctx, actor, form, staged.file)


def _validated(staged: StagedUpload) -> UploadForm:
    """The form's fields as FastAPI would have checked them (the same 422 bodies)."""
    errors: list[dict] = []
    try:
        form = UploadForm.model_validate(staged.fields)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
    if staged.file is None:
        errors.append({"type": "missing", "loc": ("body", "file"), "msg": "Field required", "input": None})
    if errors:
        raise RequestValidationError(errors)
    return form


def _store_upload(ctx: PlatformContext, actor: Actor, form: UploadForm, archive: Path) -> AdapterOut:
    req = service.UploadRequest(
        name=form.name, visibility=form.visibility, tenant_id=form.tenant_id or None, new_version=form.new_version
    )
    with unit_of_work(ctx.sessions) as session, open(archive, "rb") as upload:
        adapter = service.upload_adapter(session, ctx, actor, req, upload)
        return _out(adapter, service.granted_tenant_ids(session, [adapter])[adapter.id])


@router.get("", response_model=AdapterList)
def list_adapters(
    session: SessionDep,
    actor: AdminDep,
    tenant_id: Annotated[str | None, Query(description="Only adapters this tenant may use")] = None,
    include_superseded: bool = False,
) -> AdapterList:
    rows = service.list_adapters(session, tenant_id=tenant_id, include_superseded=include_superseded)
    grants = service.granted_tenant_ids(session, rows)
    # a tenant admin sees its own tenant's id only (shared adapters are other tenants' too)
    return AdapterList(data=[redact.adapter_for(actor, _out(a, grants[a.id])) for a in rows])


@router.get("/{adapter_id}", response_model=AdapterOut)
def get_adapter(adapter_id: str, session: SessionDep, actor: AdminDep) -> AdapterOut:
    adapter = service.get_adapter(session, adapter_id)
    return redact.adapter_for(actor, _out(adapter, service.granted_tenant_ids(session, [adapter])[adapter.id]))


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
