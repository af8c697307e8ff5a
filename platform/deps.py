"""Typed FastAPI dependencies shared by every router."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from loraplex.platform.auth.admin import Actor, authenticate_admin
from loraplex.platform.auth.key_cache import TenantAuth
from loraplex.platform.auth.tenant import authenticate_tenant
from loraplex.platform.context import PlatformContext
from loraplex.platform.db.session import unit_of_work
from loraplex.platform.errors import Unauthorized


def get_context(request: Request) -> PlatformContext:
    return request.app.state.ctx


ContextDep = Annotated[PlatformContext, Depends(get_context)]


def get_session(ctx: ContextDep) -> Iterator[Session]:
    # scope="function": the transaction commits before the response is sent, so a client that
    # sees 200 for a revocation can rely on it at its very next request.
    with unit_of_work(ctx.sessions) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def bearer_token(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key")
    return token.strip()


TokenDep = Annotated[str, Depends(bearer_token)]


def require_admin(ctx: ContextDep, token: TokenDep) -> Actor:
    return authenticate_admin(ctx, token)


AdminDep = Annotated[Actor, Depends(require_admin)]


def require_tenant(request: Request, ctx: ContextDep, token: TokenDep) -> TenantAuth:
    auth = authenticate_tenant(ctx, token)
    request.state.tenant_id = auth.tenant_id  # a 429 later in this request is counted for this tenant
    return auth


TenantDep = Annotated[TenantAuth, Depends(require_tenant)]
