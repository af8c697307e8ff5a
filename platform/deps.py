"""Typed FastAPI dependencies shared by every router."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from loraplex.platform.admin.sso import roles as sso_roles
from loraplex.platform.admin.sso import sessions as sso_sessions
from loraplex.platform.auth import key_scopes
from loraplex.platform.auth.admin import Actor, authenticate_admin
from loraplex.platform.auth.gate import parse_bearer, pre_authenticated
from loraplex.platform.auth.key_cache import TenantAuth
from loraplex.platform.auth.tenant import authenticate_tenant
from loraplex.platform.context import PlatformContext
from loraplex.platform.db.session import unit_of_work
from loraplex.platform.quotas import repository as quotas_repo
from loraplex.platform.quotas.store import QuotaView


def get_context(request: Request) -> PlatformContext:
    # put there by http/context_binding.BindContext: the routes are shared by every app of a process
    return request.state.ctx


ContextDep = Annotated[PlatformContext, Depends(get_context)]


def get_session(ctx: ContextDep) -> Iterator[Session]:
    # scope="function": the transaction commits before the response is sent, so a client that
    # sees 200 for a revocation can rely on it at its very next request.
    with unit_of_work(ctx.sessions) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def bearer_token(request: Request) -> str:
    return parse_bearer(request.headers.get("authorization", ""))


TokenDep = Annotated[str, Depends(bearer_token)]


# Both checks normally ran already, before the body was read (auth/gate.py): reuse that answer.
# An SSO session (cookie, admin page) is the other way in; its roles are then checked against the
# route (admin/sso/roles.py: one allowlist). The admin key has every role.
def require_admin(request: Request, ctx: ContextDep) -> Actor:
    cookie = sso_sessions.session_token(ctx, request.headers)
    token = sso_sessions.SESSION_MARK + cookie if cookie is not None else bearer_token(request)
    found = pre_authenticated(request.scope, "admin", token)
    if isinstance(found, Actor):
        actor = found
    elif cookie is not None:
        actor = sso_sessions.authenticate(ctx, request.method, cookie, request.headers)
    else:
        actor = authenticate_admin(ctx, token)
    route = request.scope.get("route")
    sso_roles.authorize(
        actor,
        request.method,
        sso_roles.route_template(request.url.path, getattr(route, "path_format", None)),
        request.path_params,
        request.query_params,
        lambda: unit_of_work(ctx.sessions),
    )
    return actor


AdminDep = Annotated[Actor, Depends(require_admin)]


def require_tenant(request: Request, ctx: ContextDep, token: TokenDep) -> TenantAuth:
    found = pre_authenticated(request.scope, "tenant", token)
    auth = found if isinstance(found, TenantAuth) else authenticate_tenant(ctx, token)
    request.state.tenant_id = auth.tenant_id  # a 429 later in this request is counted for this tenant
    return auth


TenantDep = Annotated[TenantAuth, Depends(require_tenant)]


def require_metered_tenant(ctx: ContextDep, session: SessionDep, tenant: TenantDep) -> TenantAuth:
    """A tenant route that generates nothing: the key's and the tenant's rpm count it (429 at the
    limit). Generation routes take ``TenantDep``: their admission counts them (once)."""
    q = quotas_repo.get(session, tenant.tenant_id)
    key_scopes.charge_request(ctx.quotas, tenant, QuotaView(rpm=q.rpm if q else None))
    return tenant


MeteredTenantDep = Annotated[TenantAuth, Depends(require_metered_tenant)]
