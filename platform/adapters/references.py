"""Adapters registered by reference: ``{"name", "source", "tenant_id", "visibility"}`` where source is
``s3://``, ``file://`` or ``hf://``. Registration fetches and validates the files once (the same
checks as an upload, so a bad reference is refused at once); every engine then fetches them on
first use into its own disk cache. The content hash is the version: new content at the source
(a new ETag / hash) becomes a new version, never served under the old one."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from loraplex.platform.adapters import repository
from loraplex.platform.adapters.models import Adapter
from loraplex.platform.adapters.service import (
    UploadRequest,
    _check_request,
    _previous_version,
    _supersede,
    adapter_row,
)
from loraplex.platform.adapters.sources.resolver import Fetched
from loraplex.platform.adapters.sources.uri import parse_source
from loraplex.platform.audit import service as audit
from loraplex.platform.auth.admin import Actor
from loraplex.platform.db.session import unit_of_work
from loraplex.platform.db.snapshot import snapshot

if TYPE_CHECKING:  # the context is built above every service; only its type is needed here
    from loraplex.platform.context import PlatformContext

# Writes of a new version found at first use (one at a time in this process).
_new_version_lock = threading.Lock()
STORE_ACTOR = Actor("store")


def register_reference(
    session: Session, ctx: PlatformContext, actor: Actor, req: UploadRequest, source: str
) -> Adapter:
    """Check the request (cheap refusals first), fetch and validate the files with no database
    connection held (the store may be slow or dead: the pool is for everyone), then check again
    and write the new version in a short transaction."""
    _check_request(session, ctx, req)
    uri = str(parse_source(source))
    _previous_version(session, req)
    release_connection(session)
    fetched = ctx.sources.resolver.fetch(uri)
    facts = ctx.engine.validate_adapter(fetched.path)
    _check_request(session, ctx, req)  # again: the world may have moved while the store answered
    previous, version = _previous_version(session, req)
    return _add_version(session, ctx, actor, req, uri, fetched, facts, previous, version)


def release_connection(session: Session) -> None:
    """End the session's read-only transaction so that its pooled connection goes back while this
    thread waits on a store (the session opens a new one at its next query). Only called before
    anything is written: a pending write here is a bug, never silently committed or lost."""
    if session.new or session.dirty or session.deleted or session.info.get("on_commit"):
        raise RuntimeError("release_connection after a write")
    session.rollback()


def _add_version(
    session: Session,
    ctx: PlatformContext,
    actor: Actor,
    req: UploadRequest,
    uri: str,
    fetched: Fetched,
    facts: Any,
    previous: Adapter | None,
    version: int,
) -> Adapter:
    adapter = adapter_row(
        req,
        facts,
        ctx.engine.model_name,
        version,
        fetched.sha256,
        fetched.size_bytes,
        storage_path="",
        source_uri=uri,
        source_etag=fetched.fingerprint or None,
    )
    repository.add(session, adapter)
    if previous is not None:
        _supersede(session, ctx, previous, adapter)
    audit.record(session, actor.name, "adapter.register", "adapter", adapter.id, None, snapshot(adapter))
    return adapter


def refresh(session: Session, ctx: PlatformContext, actor: Actor, adapter: Adapter) -> Adapter:
    """Ask the store again (no connection held meanwhile): new content becomes a new version
    (returned); else ``adapter``."""
    assert adapter.source_uri is not None
    adapter_id, source, sha = adapter.id, adapter.source_uri, adapter.sha256
    release_connection(session)
    fetched = ctx.sources.resolver.fetch(source)
    if fetched.sha256 == sha:
        return repository.get(session, adapter_id) or adapter
    facts = ctx.engine.validate_adapter(fetched.path)
    current = repository.get(session, adapter_id)
    if current is None or current.status not in repository.SERVED:
        return current or adapter  # deleted or superseded while the store answered
    return _new_version(session, ctx, actor, current, fetched, facts)


def record_changed_content(ctx: PlatformContext, adapter: Adapter, fetched: Fetched) -> None:
    """First use found new content at the source: register it as the next version (own
    transaction, so the request that found it resolves the name again and gets it)."""
    with _new_version_lock, unit_of_work(ctx.sessions) as session:
        latest = repository.active_by_name(session, adapter.name)
        if latest is None or latest.id != adapter.id:
            return  # deleted, or another request recorded it already
        _new_version(session, ctx, STORE_ACTOR, latest, fetched, ctx.engine.validate_adapter(fetched.path))


def _new_version(
    session: Session, ctx: PlatformContext, actor: Actor, current: Adapter, fetched: Fetched, facts: Any
) -> Adapter:
    req = UploadRequest(
        name=current.name, visibility=current.visibility, tenant_id=current.owner_tenant_id, new_version=True
    )
    previous, version = _previous_version(session, req)
    assert current.source_uri is not None
    return _add_version(session, ctx, actor, req, current.source_uri, fetched, facts, previous, version)
