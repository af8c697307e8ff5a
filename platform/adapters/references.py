"""Adapters registered by reference: ``{"name", "source", "tenant_id", "visibility"}`` where source is
``s3://``, ``file://`` or ``hf://``. Registration fetches and validates the files once (the same
checks as an upload, so a bad reference is refused at once); every engine then fetches them on
first use into its own disk cache. The content hash is the version: new content at the source
(a new ETag / hash) becomes a new version, never served under the old one."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

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
    _check_request(session, ctx, req)
    uri = str(parse_source(source))
    previous, version = _previous_version(session, req)
    fetched = ctx.sources.resolver.fetch(uri)
    return _add_version(session, ctx, actor, req, uri, fetched, previous, version)


def _add_version(
    session: Session,
    ctx: PlatformContext,
    actor: Actor,
    req: UploadRequest,
    uri: str,
    fetched: Fetched,
    previous: Adapter | None,
    version: int,
) -> Adapter:
    facts = ctx.gateway.validate_adapter(fetched.path)
    adapter = adapter_row(
        req,
        facts,
        ctx.gateway.model_name,
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
    """Ask the store again: new content becomes a new version (returned); else ``adapter``."""
    assert adapter.source_uri is not None
    fetched = ctx.sources.resolver.fetch(adapter.source_uri)
    if fetched.sha256 == adapter.sha256:
        return adapter
    return _new_version(session, ctx, actor, adapter, fetched)


def record_changed_content(ctx: PlatformContext, adapter: Adapter, fetched: Fetched) -> None:
    """First use found new content at the source: register it as the next version (own
    transaction, so the request that found it resolves the name again and gets it)."""
    with _new_version_lock, unit_of_work(ctx.sessions) as session:
        latest = repository.active_by_name(session, adapter.name)
        if latest is None or latest.id != adapter.id:
            return  # deleted, or another request recorded it already
        _new_version(session, ctx, STORE_ACTOR, latest, fetched)


def _new_version(session: Session, ctx: PlatformContext, actor: Actor, current: Adapter, fetched: Fetched) -> Adapter:
    req = UploadRequest(
        name=current.name, visibility=current.visibility, tenant_id=current.owner_tenant_id, new_version=True
    )
    previous, version = _previous_version(session, req)
    assert current.source_uri is not None
    return _add_version(session, ctx, actor, req, current.source_uri, fetched, previous, version)
