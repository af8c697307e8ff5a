"""Adapter lifecycle: upload (unpack safely, validate against the base model, store by content,
register with the engine), versions, grants and deletion."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from sqlalchemy.orm import Session

from loraplex.platform.adapters import repository
from loraplex.platform.adapters.archive import ArchiveLimits, UploadRejected, UploadTooLarge, extract_adapter_archive
from loraplex.platform.adapters.models import Adapter, AdapterGrant
from loraplex.platform.adapters.schemas import ADAPTER_NAME_PATTERN
from loraplex.platform.audit import service as audit
from loraplex.platform.auth.admin import Actor
from loraplex.platform.db.base import utcnow
from loraplex.platform.db.session import on_commit, on_rollback
from loraplex.platform.db.snapshot import snapshot
from loraplex.platform.errors import BadRequest, Conflict, NotFound
from loraplex.platform.tenants.service import get_tenant

if TYPE_CHECKING:  # the context is built above every service; only its type is needed here
    from loraplex.platform.context import PlatformContext


@dataclass(frozen=True)
class UploadRequest:
    name: str
    visibility: str
    tenant_id: str | None
    new_version: bool


def get_adapter(session: Session, adapter_id: str) -> Adapter:
    adapter = repository.get(session, adapter_id)
    if adapter is None or adapter.status == "deleted":
        raise NotFound(f"no adapter with id {adapter_id!r}", param="adapter_id")
    return adapter


def list_adapters(session: Session, *, tenant_id: str | None, include_superseded: bool) -> list[Adapter]:
    if tenant_id is not None:
        get_tenant(session, tenant_id)
    return repository.list_adapters(session, tenant_id=tenant_id, include_superseded=include_superseded)


def owned_by(session: Session, tenant_id: str) -> list[Adapter]:
    return repository.owned_by(session, tenant_id)


def upload_adapter(
    session: Session, ctx: PlatformContext, actor: Actor, req: UploadRequest, upload: IO[bytes]
) -> Adapter:
    _check_request(session, ctx, req)
    previous, version = _previous_version(session, req)
    limits = ctx.settings.uploads
    with ctx.store.staging() as scratch:
        archive = scratch / "upload"
        _copy_limited(upload, archive, limits.max_upload_bytes)
        files = scratch / "files"
        files.mkdir()
        extract_adapter_archive(archive, files, ArchiveLimits(limits.max_members, limits.max_unpacked_bytes))
        facts = ctx.engine.validate_adapter(files)
        size = sum(p.stat().st_size for p in files.iterdir())
        sha = ctx.store.content_hash(files)
        relative, is_new = ctx.store.put(files, sha)
    if is_new:
        on_rollback(session, lambda: ctx.store.remove(relative))
    adapter = adapter_row(req, facts, ctx.engine.model_name, version, sha, size, storage_path=relative)
    repository.add(session, adapter)
    if previous is not None:
        _supersede(session, ctx, previous, adapter)
    adapter_id = adapter.id
    ctx.engine.add_adapter(adapter_id, ctx.store.path_of(relative))
    on_rollback(session, lambda: ctx.engine.remove_adapter(adapter_id))
    audit.record(session, actor.name, "adapter.create", "adapter", adapter.id, None, snapshot(adapter))
    return adapter


def delete_adapter(session: Session, ctx: PlatformContext, actor: Actor, adapter_id: str) -> None:
    """Soft delete: the row stays (usage history names it), its files and grants go, and requests
    using it are stopped (billed for what they delivered)."""
    adapter = get_adapter(session, adapter_id)
    before = snapshot(adapter)
    still_referenced = repository.count_with_sha(session, adapter.sha256, adapter.id) > 0
    relative = adapter.storage_path
    for grant in repository.grants(session, adapter.id):
        repository.delete(session, grant)
    adapter.status, adapter.deleted_at = "deleted", utcnow()
    session.flush()

    def stop_and_unload() -> None:
        ctx.inflight.abort(ctx.engine, f"adapter {adapter_id} was deleted", adapter_id=adapter_id)
        ctx.engine.remove_adapter(adapter_id)
        ctx.sources.forget(adapter_id)

    on_commit(session, stop_and_unload)
    if not still_referenced and relative:  # by reference: no store folder (its cache copy ages out)
        on_commit(session, lambda: ctx.store.remove(relative))
    audit.record(session, actor.name, "adapter.delete", "adapter", adapter_id, before, snapshot(adapter))


def drop_grants_of_tenant(session: Session, tenant_id: str) -> None:
    for grant in repository.grants_of_tenant(session, tenant_id):
        repository.delete(session, grant)


def add_grant(session: Session, actor: Actor, adapter_id: str, tenant_id: str) -> AdapterGrant:
    adapter = get_adapter(session, adapter_id)
    get_tenant(session, tenant_id)
    if adapter.visibility == "shared":
        raise BadRequest("shared adapters are usable by every tenant; grants apply to private ones", param="adapter_id")
    if adapter.owner_tenant_id == tenant_id:
        raise BadRequest("the owning tenant can always use its adapter", param="tenant_id")
    if repository.get_grant(session, adapter_id, tenant_id) is not None:
        raise Conflict(f"tenant {tenant_id!r} already has a grant on {adapter_id!r}", param="tenant_id")
    grant = AdapterGrant(adapter_id=adapter_id, tenant_id=tenant_id)
    repository.add(session, grant)
    audit.record(session, actor.name, "adapter.grant", "adapter", adapter_id, None, {"tenant_id": tenant_id})
    return grant


def remove_grant(session: Session, actor: Actor, adapter_id: str, tenant_id: str) -> None:
    get_adapter(session, adapter_id)
    grant = repository.get_grant(session, adapter_id, tenant_id)
    if grant is None:
        raise NotFound(f"tenant {tenant_id!r} has no grant on {adapter_id!r}", param="tenant_id")
    repository.delete(session, grant)
    audit.record(session, actor.name, "adapter.revoke_grant", "adapter", adapter_id, {"tenant_id": tenant_id}, None)


def granted_tenant_ids(session: Session, adapters: list[Adapter]) -> dict[str, list[str]]:
    return repository.granted_tenant_ids(session, [a.id for a in adapters])


def _check_request(session: Session, ctx: PlatformContext, req: UploadRequest) -> None:
    if not re.match(ADAPTER_NAME_PATTERN, req.name):
        raise BadRequest(
            "name must be 1-64 characters: letters, digits, '.', '_' or '-', starting with a letter or digit",
            param="name",
        )
    if req.name == ctx.engine.model_name:
        raise Conflict(f"{req.name!r} is the base model's name", param="name")
    if req.visibility not in ("private", "shared"):
        raise BadRequest("visibility must be 'private' or 'shared'", param="visibility")
    if req.visibility == "private" and not req.tenant_id:
        raise BadRequest("a private adapter needs the owning tenant_id", param="tenant_id")
    if req.visibility == "shared" and req.tenant_id:
        raise BadRequest("a shared adapter has no owning tenant; leave tenant_id out", param="tenant_id")
    if req.tenant_id:
        get_tenant(session, req.tenant_id)


def _previous_version(session: Session, req: UploadRequest) -> tuple[Adapter | None, int]:
    """The version the upload replaces (None for a new name) and the new version's number.
    Deleted versions keep their numbers (usage history names them), so a name can be reused."""
    every = repository.versions(session, req.name)
    existing = [a for a in every if a.status != "deleted"]
    next_version = (every[-1].version + 1) if every else 1
    if existing and not req.new_version:
        raise Conflict(
            f"an adapter named {req.name!r} exists; set new_version=true to upload a new version",
            param="name",
            code="adapter_exists",
        )
    if not existing:
        if req.new_version:
            raise NotFound(f"no adapter named {req.name!r} to make a new version of", param="name")
        return None, next_version
    latest = existing[-1]
    owner = req.tenant_id if req.visibility == "private" else None
    if (latest.visibility, latest.owner_tenant_id) != (req.visibility, owner):
        raise Conflict(
            f"adapter {req.name!r} is {latest.visibility}"
            + (f" (owner {latest.owner_tenant_id})" if latest.owner_tenant_id else "")
            + "; a new version must keep its visibility and owner",
            param="visibility",
        )
    return latest, next_version


def _supersede(session: Session, ctx: PlatformContext, previous: Adapter, current: Adapter) -> None:
    """The new version takes the name; grants carry over; the old one leaves the engine."""
    for grant in repository.grants(session, previous.id):
        repository.add(session, AdapterGrant(adapter_id=current.id, tenant_id=grant.tenant_id))
    for old in repository.versions(session, previous.name):
        if old.id != current.id and old.status in repository.SERVED:
            old.status = "superseded"
            on_commit(session, _unload_later(ctx, old.id))
    session.flush()


def _unload_later(ctx: PlatformContext, adapter_id: str) -> Callable[[], None]:
    """A callback that takes ``adapter_id`` out of the engine (bound now, run after commit)."""

    def unload() -> None:
        ctx.engine.remove_adapter(adapter_id)
        ctx.sources.forget(adapter_id)

    return unload


def _copy_limited(src: IO[bytes], dest, limit: int) -> None:
    copied = 0
    with open(dest, "wb") as out:
        while chunk := src.read(1 << 20):
            copied += len(chunk)
            if copied > limit:
                raise UploadTooLarge(f"the upload is larger than {limit} bytes", param="file")
            out.write(chunk)
    if copied == 0:
        raise UploadRejected("the uploaded file is empty", param="file")


def adapter_row(
    req: UploadRequest, facts, model_name: str, version: int, sha256: str, size_bytes: int, **where: str | None
) -> Adapter:
    """The new version's row from the request and the validated files (an upload says
    ``storage_path``; a reference says ``source_uri``/``source_etag``)."""
    return Adapter(
        name=req.name,
        version=version,
        visibility=req.visibility,
        owner_tenant_id=req.tenant_id if req.visibility == "private" else None,
        base_model=facts.base_model or model_name,
        rank=facts.rank,
        alpha=facts.alpha,
        target_modules=facts.target_modules,
        use_rslora=facts.use_rslora,
        sha256=sha256,
        size_bytes=size_bytes,
        status="active",
        **where,
    )
