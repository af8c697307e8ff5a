"""Admin authentication: the configured LORAPLEX_ADMIN_KEY, or a key generated on first start
(printed once; only its HMAC is stored)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from loraplex.platform.auth.tenant import lookup_tenant_key
from loraplex.platform.auth.tokens import ADMIN_KEY_PREFIX, display_prefix, generate_key
from loraplex.platform.db.session import unit_of_work
from loraplex.platform.errors import Forbidden, Unauthorized
from loraplex.platform.keys.models import AdminKey

if TYPE_CHECKING:  # the context is built above every service; only its type is needed here
    from loraplex.platform.context import PlatformContext


@dataclass(frozen=True)
class Actor:
    """Who is making a change, as written to the audit log, and what they may do: an admin key
    may do everything; an SSO session's roles come from its identity provider (admin/sso/roles.py)."""

    name: str
    roles: frozenset[str] = field(default=frozenset({"admin"}))


CLI_ACTOR = Actor("cli")


def authenticate_admin(ctx: PlatformContext, token: str) -> Actor:
    configured = ctx.settings.admin_key
    if configured and hmac.compare_digest(token.encode(), configured.encode()):
        return Actor("admin")
    key_hash = ctx.hasher.hash(token)
    with unit_of_work(ctx.sessions) as session:
        admin = session.scalar(select(AdminKey).where(AdminKey.key_hash == key_hash))
        if admin is not None:
            return Actor(f"admin:{admin.prefix}")
        if lookup_tenant_key(session, ctx, key_hash) is not None:
            raise Forbidden("this is a tenant API key; the admin API needs an admin key")
    raise Unauthorized("invalid admin key")


def ensure_admin_key(session: Session, hasher, configured_key: str) -> str | None:
    """On first start without a configured admin key, create one; return it (to print once)."""
    if configured_key:
        return None
    if session.scalar(select(func.count()).select_from(AdminKey)):
        return None
    key = generate_key(ADMIN_KEY_PREFIX)
    session.add(AdminKey(prefix=display_prefix(key), key_hash=hasher.hash(key)))
    return key


def rotate_admin_key(session: Session, hasher) -> str:
    """Replace every generated admin key with a fresh one (CLI: lost the printed key)."""
    for old in session.scalars(select(AdminKey)):
        session.delete(old)
    key = generate_key(ADMIN_KEY_PREFIX)
    session.add(AdminKey(prefix=display_prefix(key), key_hash=hasher.hash(key)))
    return key
