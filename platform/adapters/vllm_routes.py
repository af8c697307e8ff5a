"""vLLM's dynamic LoRA API, so tooling written for vLLM (KServe, llm-d, Dynamo) drives loraplex
unchanged: ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` and
``POST /v1/unload_lora_adapter {"lora_name"}``. Admin key only. A loaded adapter is shared (every
tenant may use it, as on vLLM); ``lora_path`` is a local folder or an s3://, file://, hf:// URI."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from loraplex.platform.adapters import references, repository, service
from loraplex.platform.adapters.models import Adapter
from loraplex.platform.deps import AdminDep, ContextDep, SessionDep
from loraplex.platform.errors import BadRequest, NotFound
from loraplex.platform.http.openapi_errors import ErrorBody

router = APIRouter(prefix="/v1", tags=["vllm"])


class LoadLoRAAdapter(BaseModel):
    model_config = ConfigDict(extra="ignore")  # vLLM clients may send fields of newer versions

    lora_name: Annotated[str, Field(max_length=64)]
    lora_path: Annotated[str, Field(max_length=1024)]
    load_inplace: bool = False  # vLLM: replace an adapter already loaded under this name


class UnloadLoRAAdapter(BaseModel):
    model_config = ConfigDict(extra="ignore")

    lora_name: Annotated[str, Field(max_length=64)]
    lora_int_id: int | None = None  # accepted for compatibility; names identify adapters here


def _json_errors() -> dict[int | str, dict[str, Any]]:
    """These routes answer plain text (as vLLM's do) but their errors are JSON: say so in the
    OpenAPI document (FastAPI would list the errors under the route's text/plain type)."""
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    return {s: {"model": ErrorBody, "description": d, "content": dict(body)} for s, d in _ERRORS.items()}


_ERRORS = {
    400: "Invalid request or the adapter is already loaded",
    401: "Missing or invalid API key",
    403: "Not an admin key",
    404: "No such adapter",
    408: "The request body did not arrive in time",
    409: "Conflicts with existing data",
    413: "The request body is too large",
    422: "A parameter fails validation",
    503: "The adapter store or the engine is unavailable",
}


def _live_versions(session, name: str) -> list[Adapter]:
    """Every version of ``name`` not deleted (the served one last), superseded ones included."""
    return [a for a in repository.versions(session, name) if a.status != "deleted"]


def _refuse_private(name: str, live: list[Adapter], verb: str) -> None:
    """vLLM's API sees only shared adapters: a tenant's private one is neither replaced nor
    removed through it (nor is its owner told about, beyond the refusal)."""
    if any((a.visibility, a.owner_tenant_id) != ("shared", None) for a in live):
        raise BadRequest(f"'{name}' is a private adapter; {verb} it through the admin API", param="lora_name")


@router.post("/load_lora_adapter", response_class=PlainTextResponse, responses=_json_errors())
def load_lora_adapter(body: LoadLoRAAdapter, session: SessionDep, ctx: ContextDep, actor: AdminDep) -> str:
    served = repository.active_by_name(session, body.lora_name)
    if served is not None and not body.load_inplace:
        raise BadRequest(f"The lora adapter '{body.lora_name}' has already been loaded.", param="lora_name")
    live = _live_versions(session, body.lora_name)
    _refuse_private(body.lora_name, live, "replace")
    # vLLM has no versions: loading a name again (in place, or after an admin delete left older
    # versions) simply serves the new files; here that is a new version of the name.
    req = service.UploadRequest(name=body.lora_name, visibility="shared", tenant_id=None, new_version=bool(live))
    adapter = references.register_reference(session, ctx, actor, req, body.lora_path)
    if ctx.engine.enabled:  # vLLM loads at once: the first request finds it ready
        ctx.sources.ensure_served(adapter, lambda a, fetched: None)
    return f"Success: LoRA adapter '{body.lora_name}' added successfully."


@router.post("/unload_lora_adapter", response_class=PlainTextResponse, responses=_json_errors())
def unload_lora_adapter(body: UnloadLoRAAdapter, session: SessionDep, ctx: ContextDep, actor: AdminDep) -> str:
    """vLLM forgets the name: every version of it goes (soft-deleted: usage history keeps them),
    so loading the name again later is a plain load."""
    if repository.active_by_name(session, body.lora_name) is None:
        raise NotFound(f"The lora adapter '{body.lora_name}' cannot be found.", param="lora_name")
    live = _live_versions(session, body.lora_name)
    _refuse_private(body.lora_name, live, "remove")
    for adapter in live:
        service.delete_adapter(session, ctx, actor, adapter.id)
    return f"Success: LoRA adapter '{body.lora_name}' removed successfully."
