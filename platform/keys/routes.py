from __future__ import annotations

from fastapi import APIRouter, status

from loraplex.platform.deps import AdminDep, ContextDep, SessionDep
from loraplex.platform.keys import service
from loraplex.platform.keys.schemas import KeyCreate, KeyCreated, KeyList, KeyOut, KeyScope

router = APIRouter(tags=["keys"])


@router.post("/tenants/{tenant_id}/keys", status_code=status.HTTP_201_CREATED, response_model=KeyCreated)
def create_key(tenant_id: str, body: KeyCreate, session: SessionDep, ctx: ContextDep, actor: AdminDep) -> KeyCreated:
    """Create an API key. The response holds the full key; it is never shown again."""
    scope = KeyScope(**body.model_dump(include={"allowed_models", "rpm", "tpm", "max_concurrent"}))
    key, secret = service.create_key(
        session, ctx, actor, tenant_id, body.name, body.expires_at, scope, project_id=body.project_id
    )
    return KeyCreated(**KeyOut.model_validate(key).model_dump(), key=secret)


@router.get("/tenants/{tenant_id}/keys", response_model=KeyList)
def list_keys(tenant_id: str, session: SessionDep, _actor: AdminDep) -> KeyList:
    keys = service.list_keys(session, tenant_id)
    return KeyList(data=[KeyOut.model_validate(k) for k in keys])


@router.delete("/keys/{key_id}", response_model=KeyOut)
def revoke_key(key_id: str, session: SessionDep, ctx: ContextDep, actor: AdminDep) -> KeyOut:
    """Revoke a key. It stops working at the next request."""
    return KeyOut.model_validate(service.revoke_key(session, ctx, actor, key_id))


@router.put("/keys/{key_id}/scope", response_model=KeyOut)
def set_key_scope(key_id: str, body: KeyScope, session: SessionDep, ctx: ContextDep, actor: AdminDep) -> KeyOut:
    """Limit a key to some models and/or give it rpm / tpm / concurrency limits of its own (on top
    of its tenant's). Fields left out are cleared. Applies from the key's next request."""
    return KeyOut.model_validate(service.set_scope(session, ctx, actor, key_id, body))
