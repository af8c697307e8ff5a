"""POST /v1/responses, GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items.
Generation goes through the chat path (``request_path.chat``): one admission, one billing. Stored
responses are per tenant and per key scope, bounded and expiring (``store.py``); reading them
counts against the key's and the tenant's rpm (``MeteredTenantDep``)."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from loraplex.platform.auth import key_scopes
from loraplex.platform.auth.key_cache import TenantAuth
from loraplex.platform.db.session import unit_of_work
from loraplex.platform.deps import ContextDep, MeteredTenantDep, SessionDep, TenantDep
from loraplex.platform.errors import BadRequest, NotFound
from loraplex.platform.http import request_id
from loraplex.platform.inference import request_path
from loraplex.platform.inference.context_window import ContextLengthExceeded
from loraplex.platform.inference.responses_api import convert, input_items, store
from loraplex.platform.inference.responses_api.events import translate
from loraplex.platform.inference.responses_api.schemas import MAX_INCLUDE, Includable, ResponsesRequest
from loraplex.platform.quotas import repository as quotas_repo
from loraplex.platform.quotas.store import QuotaView

if TYPE_CHECKING:
    from loraplex.platform.context import PlatformContext

router = APIRouter(tags=["openai"])
log = logging.getLogger(__name__)


def _missing(response_id: str, param: str = "response_id") -> NotFound:
    return NotFound(f"no response with id {response_id!r}", param=param, code="response_not_found")


def _limits(ctx: PlatformContext) -> store.Limits:
    return store.Limits.from_settings(ctx.settings)


def _before_generation(ctx: PlatformContext, auth: TenantAuth, body: ResponsesRequest) -> list[dict[str, Any]]:
    """What must hold before the chat path runs: a tenant or key at its rate or concurrency limit
    reads no stored response (429, consuming nothing: admission counts the request); a request
    asking to store while its tenant is at a cap is refused (400) before it is billed. Returns the
    history ``previous_response_id`` continues (one this key may see, else 404)."""
    limits = _limits(ctx)
    with unit_of_work(ctx.sessions) as session:
        q = quotas_repo.get(session, auth.tenant_id)
        ctx.quotas.precheck(auth.tenant_id, QuotaView(q.rpm, None, q.max_concurrent) if q else QuotaView())
        key_scopes.precheck(ctx.quotas, auth)
        if body.store:
            why = store.over_limits(session, auth.tenant_id, limits)
            if why is not None:
                raise BadRequest(
                    f"cannot store this response: {why}. Delete stored responses (DELETE /v1/responses/{{id}}), "
                    f"wait for them to expire ({limits.retention.days} days) or send store: false",
                    param="store",
                    code="stored_responses_limit_exceeded",
                )
        if body.previous_response_id is None:
            return []
        row = store.get(session, auth, body.previous_response_id, limits)
        if row is None:
            raise _missing(body.previous_response_id, "previous_response_id")
        previous = json.loads(row.body)
        return json.loads(row.conversation) + convert.output_as_messages(previous["output"])


def _save(ctx: PlatformContext, auth: TenantAuth, response: dict[str, Any], conversation: list[dict[str, Any]]) -> bool:
    with unit_of_work(ctx.sessions) as session:
        return store.put(session, auth, response, conversation, _limits(ctx))


@router.post("/responses")
async def create_response(body: ResponsesRequest, ctx: ContextDep, tenant: TenantDep, request: Request):
    body.check()
    history = await run_in_threadpool(_before_generation, ctx, tenant, body)
    chat, conversation = convert.to_chat(body, history)
    rid = convert.new_id("resp")
    try:  # refusals are HTTP errors, before any byte
        result = await request_path.chat(chat, ctx, tenant, request_id.of(request.scope))
    except ContextLengthExceeded as exc:
        exc.param = "input"  # the Responses API's name for what the chat path calls messages
        raise
    headers = {k: v for k, v in result.headers.items() if k.startswith(("x-", "retry-after"))}

    async def finish(output: list[dict[str, Any]], chat_usage: dict | None, reason: str | None) -> dict[str, Any]:
        final = convert.response_object(
            body, rid, status="completed", output=output, usage_=convert.usage(chat_usage), finish_reason=reason
        )
        if body.store:
            try:
                stored = await run_in_threadpool(_save, ctx, tenant, final, conversation)
            except SQLAlchemyError as exc:
                # The answer was generated and billed (the usage ledger spools through an outage):
                # a failed store must not turn it into a 503 or cut the stream before
                # response.completed. It is delivered, saying it was not stored.
                log.warning("response %s not stored: %s", rid, str(exc).splitlines()[0][:200])
                stored = False
            # Past a cap (concurrent requests took the last places): delivered, not stored.
            final["store"] = stored
        return final

    if isinstance(result, StreamingResponse):
        start = convert.response_object(body, rid, status="in_progress", output=[], usage_=None)
        return StreamingResponse(
            translate(result.body_iterator, start, finish), media_type="text/event-stream", headers=headers
        )
    data = json.loads(bytes(result.body))
    choice = data["choices"][0]
    output = convert.output_from_message(choice["message"])
    final = await finish(output, data.get("usage"), choice.get("finish_reason"))
    return JSONResponse(final, headers=headers)


@router.get("/responses/{response_id}")
def get_response(response_id: str, session: SessionDep, ctx: ContextDep, tenant: MeteredTenantDep) -> JSONResponse:
    row = store.get(session, tenant, response_id, _limits(ctx))
    if row is None:
        raise _missing(response_id)
    return JSONResponse(json.loads(row.body))


@router.delete("/responses/{response_id}")
def delete_response(response_id: str, session: SessionDep, ctx: ContextDep, tenant: MeteredTenantDep) -> dict[str, Any]:
    if not store.remove(session, tenant, response_id, _limits(ctx)):
        raise _missing(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


@router.get("/responses/{response_id}/input_items")
def list_input_items(
    response_id: str,
    session: SessionDep,
    ctx: ContextDep,
    tenant: MeteredTenantDep,
    after: Annotated[str | None, Query(max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    include: Annotated[list[Includable] | None, Query(max_length=MAX_INCLUDE)] = None,  # known values: accepted
) -> dict[str, Any]:
    row = store.get(session, tenant, response_id, _limits(ctx))
    if row is None:
        raise _missing(response_id)
    items = input_items.items_of(row.id, json.loads(row.conversation))
    return input_items.page(items, after=after, limit=limit, order=order)
