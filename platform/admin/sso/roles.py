"""What each admin role may do, as data: one table of the routes a tenant admin may call and how
each route names its tenant, checked in one place (``authorize``, called by ``deps.require_admin``).

- ``admin``: every admin route.
- ``viewer``: every admin route that only reads (GET/HEAD); 403 on anything that writes.
- ``tenant_admin:<tenant id>``: only the routes below, and only for that tenant: the tenant
  itself, its projects (create, change, archive: within the tenant's own limits, which stay the
  operator's), its keys (create, revoke, scope), its quota and consumption (read: quotas are what the
  operator grants, not something a tenant raises), its adapters (read), its usage and its spend (the price book itself is the operator's). Any route not
  in the table, new ones included, is refused: the allowlist fails closed.

Role names come from the identity provider through ``sso.role_map`` (roles_for_claims)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from loraplex.platform.errors import Forbidden

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from loraplex.platform.auth.admin import Actor

ADMIN, VIEWER, TENANT_ADMIN = "admin", "viewer", "tenant_admin:"
READ_METHODS = frozenset({"GET", "HEAD"})

# How a route names the tenant it acts on: from the path, the query string, or the object's owner.
TenantOf = Callable[["Session", Mapping[str, str], Mapping[str, str]], "str | None"]


def _path_tenant(_s: Session, path: Mapping[str, str], _q: Mapping[str, str]) -> str | None:
    return path.get("tenant_id")


def _query_tenant(_s: Session, _p: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    return query.get("tenant_id")  # absent: every tenant's rows, never allowed to a tenant admin


def _key_tenant(session: Session, path: Mapping[str, str], _q: Mapping[str, str]) -> str | None:
    from loraplex.platform.keys.models import ApiKey

    key = session.get(ApiKey, path.get("key_id", ""))
    return key.tenant_id if key is not None else None


def _adapter_tenant(session: Session, path: Mapping[str, str], _q: Mapping[str, str]) -> str | None:
    from loraplex.platform.adapters.models import Adapter

    adapter = session.get(Adapter, path.get("adapter_id", ""))
    return adapter.owner_tenant_id if adapter is not None else None


def _project_tenant(session: Session, path: Mapping[str, str], _q: Mapping[str, str]) -> str | None:
    from loraplex.platform.projects.models import Project

    project = session.get(Project, path.get("project_id", ""))
    return project.tenant_id if project is not None else None


P = "/admin/v1"
TENANT_ADMIN_ROUTES: dict[tuple[str, str], TenantOf] = {
    ("GET", f"{P}/tenants/{{tenant_id}}"): _path_tenant,
    ("GET", f"{P}/tenants/{{tenant_id}}/keys"): _path_tenant,
    ("POST", f"{P}/tenants/{{tenant_id}}/keys"): _path_tenant,
    ("DELETE", f"{P}/keys/{{key_id}}"): _key_tenant,
    ("PUT", f"{P}/keys/{{key_id}}/scope"): _key_tenant,
    ("GET", f"{P}/tenants/{{tenant_id}}/projects"): _path_tenant,
    ("POST", f"{P}/tenants/{{tenant_id}}/projects"): _path_tenant,
    ("GET", f"{P}/projects/{{project_id}}"): _project_tenant,
    ("PATCH", f"{P}/projects/{{project_id}}"): _project_tenant,
    ("DELETE", f"{P}/projects/{{project_id}}"): _project_tenant,
    ("GET", f"{P}/tenants/{{tenant_id}}/quota"): _path_tenant,
    ("GET", f"{P}/tenants/{{tenant_id}}/quota/consumption"): _path_tenant,
    ("GET", f"{P}/adapters"): _query_tenant,
    ("GET", f"{P}/adapters/{{adapter_id}}"): _adapter_tenant,
    ("GET", f"{P}/usage"): _query_tenant,
    ("GET", f"{P}/usage/export"): _query_tenant,
    ("GET", f"{P}/usage/series"): _query_tenant,
    ("GET", f"{P}/spend"): _query_tenant,
    ("GET", f"{P}/spend/export"): _query_tenant,
}


def route_template(path: str, path_format: str | None) -> str:
    """The full template of the matched route (``/admin/v1/keys/{key_id}``): FastAPI keeps included
    routers nested, so a route knows only its template below its own router's prefix; the prefix is
    the request path's leading segments."""
    if not path_format:
        return path
    segments = path.rstrip("/").split("/")
    keep = len(segments) - path_format.count("/")
    return "/".join(segments[:keep]) + path_format if keep > 0 else path_format


def tenants_administered(roles: frozenset[str]) -> set[str]:
    return {r[len(TENANT_ADMIN) :] for r in roles if r.startswith(TENANT_ADMIN)}


def authorize(
    actor: Actor,
    method: str,
    route_path: str,
    path_params: Mapping[str, Any],
    query: Mapping[str, str],
    session_factory: Callable[[], Any],
) -> None:
    """Raise 403 unless ``actor``'s roles allow this route (``route_path``: the route's template)."""
    roles = actor.roles
    if ADMIN in roles:
        return
    method = method.upper()
    if VIEWER in roles and method in READ_METHODS:
        return
    tenants = tenants_administered(roles)
    tenant_of = TENANT_ADMIN_ROUTES.get(("GET" if method == "HEAD" else method, route_path))
    if tenants and tenant_of is not None:
        with session_factory() as session:
            tenant_id = tenant_of(session, {k: str(v) for k, v in path_params.items()}, query)
        if tenant_id in tenants:
            return
        raise Forbidden(f"{actor.name} may only administer tenant(s) {', '.join(sorted(tenants))}", code="forbidden")
    if VIEWER in roles and not tenants:
        raise Forbidden(f"{actor.name} has the viewer role: read-only", code="forbidden")
    raise Forbidden(f"{actor.name} may not call {method} {route_path}", code="forbidden")


def roles_for_claims(claims: Mapping[str, Any], role_claim: str, role_map: Mapping[str, list[str]]) -> list[str]:
    """The roles an ID token's claim values map to (empty: this user may not sign in)."""
    value = claims.get(role_claim)
    values = (
        [value]
        if isinstance(value, str)
        else [v for v in value if isinstance(v, str)]
        if isinstance(value, list)
        else []
    )
    roles: set[str] = set()
    for v in values:
        roles.update(role_map.get(v, ()))
    return sorted(roles)
