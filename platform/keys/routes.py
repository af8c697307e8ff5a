from __future__ import annotations

from fastapi import APIRouter, status

from loraplex.platform.deps import AdminDep, ContextDep, SessionDep
from loraplex.platform.keys import service
from loraplex.platform.keys.schemas import KeyCreate, KeyCreated, KeyList, KeyOut

router = APIRouter(tags=["keys"])


@router.post("/tenants/{tenant_id}/keys", status_code=status.HTTP_201_CREATED, response_model=KeyCreated)
def create_key(tenant_id: str, body: KeyCreate, session: SessionDep, ctx: ContextDep, actor: AdminDep) -> KeyCreated:
    """Create an API key. The response holds the full key; it is never shown again."""
    key, secret = service.create_key(session, ctx, actor, tenant_id, body.name, body.expires_at)
    return KeyCreated(**KeyOut.model_validate(key).model_dump(), key=secret)


@router.get("/tenants/{tenant_id}/keys", response_model=KeyList)
def list_keys(tenant_id: str, session: SessionDep, _actor: AdminDep) -> KeyList:
    keys = service.list_keys(session, tenant_id)
    return KeyList(data=[KeyOut.model_validate(k) for k in keys])


@router.delete("/keys/{key_id}", response_model=KeyOut)
def revoke_key(key_id: str, session: SessionDep, ctx: ContextDep, actor: AdminDep) -> KeyOut:
    """Revoke a key. It stops working at the next request."""
    return KeyOut.model_validate(service.revoke_key(session, ctx, actor, key_id))
