from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from loraplex.platform.audit import service as audit
from loraplex.platform.auth.admin import Actor
from loraplex.platform.auth.tokens import display_prefix, generate_key
from loraplex.platform.db.base import utcnow
from loraplex.platform.db.session import on_commit
from loraplex.platform.db.snapshot import snapshot
from loraplex.platform.errors import BadRequest, Conflict, NotFound
from loraplex.platform.keys import repository
from loraplex.platform.keys.models import ApiKey
from loraplex.platform.keys.schemas import KeyScope
from loraplex.platform.tenants.service import get_tenant

if TYPE_CHECKING:  # the context is built above every service; only its type is needed here
    from loraplex.platform.context import PlatformContext


def create_key(
    session: Session,
    ctx: PlatformContext,
    actor: Actor,
    tenant_id: str,
    name: str,
    expires_at: datetime | None,
    scope: KeyScope | None = None,
    project_id: str | None = None,
) -> tuple[ApiKey, str]:
    get_tenant(session, tenant_id)
    if project_id is not None:
        from loraplex.platform.projects.service import check_for_key  # projects list keys: import late

        check_for_key(session, tenant_id, project_id)
    if expires_at is not None and expires_at <= utcnow():
        raise BadRequest("expires_at must be in the future", param="expires_at")
    secret = generate_key()
    key = ApiKey(
        tenant_id=tenant_id,
        name=name,
        prefix=display_prefix(secret),
        key_hash=ctx.hasher.hash(secret),
        expires_at=expires_at,
        project_id=project_id,
    )
    _apply_scope(key, scope or KeyScope())
    repository.add(session, key)
    audit.record(session, actor.name, "key.create", "api_key", key.id, None, _audit_view(key))
    return key, secret


def list_keys(session: Session, tenant_id: str) -> list[ApiKey]:
    get_tenant(session, tenant_id)
    return repository.list_for_tenant(session, tenant_id)


def delete_keys_of_tenant(session: Session, tenant_id: str) -> None:
    """With a deleted tenant: every key revoked and hidden (rows kept for the usage history)."""
    now = utcnow()
    for key in repository.list_for_tenant(session, tenant_id):
        key.revoked_at = key.revoked_at or now
        key.deleted_at = now
    session.flush()


def revoke_key(session: Session, ctx: PlatformContext, actor: Actor, key_id: str) -> ApiKey:
    key = repository.get(session, key_id)
    if key is None or key.deleted_at is not None:
        raise NotFound(f"no API key with id {key_id!r}", param="key_id")
    if key.revoked_at is not None:
        raise Conflict(f"API key {key_id!r} is already revoked", code="already_revoked")
    before = _audit_view(key)
    key.revoked_at = utcnow()
    session.flush()
    # Evict now (this request) and again after commit, so no lookup racing the commit re-caches it.
    ctx.key_cache.evict_hash(key.key_hash)
    key_hash = key.key_hash
    on_commit(session, lambda: ctx.key_cache.evict_hash(key_hash))
    audit.record(session, actor.name, "key.revoke", "api_key", key.id, before, _audit_view(key))
    key_id = key.id
    on_commit(session, lambda: ctx.inflight.abort(ctx.engine, f"API key {key_id} was revoked", key_id=key_id))
    return key


def set_scope(session: Session, ctx: PlatformContext, actor: Actor, key_id: str, scope: KeyScope) -> ApiKey:
    """Replace the key's scope (models and own limits); it applies from the next request."""
    key = repository.get(session, key_id)
    if key is None or key.deleted_at is not None:
        raise NotFound(f"no API key with id {key_id!r}", param="key_id")
    before = _audit_view(key)
    _apply_scope(key, scope)
    session.flush()
    ctx.key_cache.evict_hash(key.key_hash)
    key_hash = key.key_hash
    on_commit(session, lambda: ctx.key_cache.evict_hash(key_hash))
    audit.record(session, actor.name, "key.scope", "api_key", key.id, before, _audit_view(key))
    return key


def _apply_scope(key: ApiKey, scope: KeyScope) -> None:
    models = None if scope.allowed_models is None else sorted(set(scope.allowed_models))
    key.allowed_models, key.rpm, key.tpm, key.max_concurrent = models, scope.rpm, scope.tpm, scope.max_concurrent


def _audit_view(key: ApiKey) -> dict:
    return snapshot(key, exclude=("key_hash",))
