"""What a tenant admin may read of rows that also concern other tenants. ``roles.authorize`` lets
a tenant admin list the adapters its tenant may use, and that list holds shared adapters owned by
other tenants and adapters granted to several: their ``owner_tenant_id`` and
``granted_tenant_ids`` would tell one customer who the operator's other customers are. A tenant
admin sees its own tenant's id and no other (``None`` / dropped); an operator admin or viewer sees
everything. A webhook's URL is shown whole to an operator admin only (its path is often the
receiver's credential); a viewer, and the audit log, get its origin."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from loraplex.platform.admin.sso.roles import ADMIN, VIEWER, tenants_administered

if TYPE_CHECKING:
    from loraplex.platform.adapters.schemas import AdapterOut
    from loraplex.platform.auth.admin import Actor


def visible_tenants(actor: Actor) -> set[str] | None:
    """The tenant ids ``actor`` may see in a response; ``None``: every one."""
    if ADMIN in actor.roles or VIEWER in actor.roles:
        return None
    return tenants_administered(actor.roles)


def adapter_for(actor: Actor, out: AdapterOut) -> AdapterOut:
    tenants = visible_tenants(actor)
    if tenants is None:
        return out
    owner = out.owner_tenant_id if out.owner_tenant_id in tenants else None
    return out.model_copy(
        update={"owner_tenant_id": owner, "granted_tenant_ids": [t for t in out.granted_tenant_ids if t in tenants]}
    )


def url_origin(url: str) -> str:
    """``scheme://host[:port]/…``: a webhook URL without its path and query, which for many
    receivers (Slack's, Discord's, Teams' incoming webhooks) ARE the credential."""
    parts = urlsplit(url)
    rest = "/…" if (parts.path not in ("", "/") or parts.query) else "/"
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{rest}"


def webhook_url_for(actor: Actor, url: str) -> str:
    """The operator admin sees the whole URL; a read-only viewer its origin only."""
    return url if ADMIN in actor.roles else url_origin(url)
