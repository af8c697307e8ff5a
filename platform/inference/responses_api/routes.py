"""POST /v1/responses, GET and DELETE /v1/responses/{id}. Generation goes through the chat path
(``request_path.chat``): one admission, one billing. Stored responses are per tenant."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from loraplex.platform.db.session import unit_of_work
from loraplex.platform.deps import ContextDep, SessionDep, TenantDep
from loraplex.platform.errors import NotFound
from loraplex.platform.inference import request_path
from loraplex.platform.inference.responses_api import convert, store
from loraplex.platform.inference.responses_api.events import translate
from loraplex.platform.inference.responses_api.schemas import ResponsesRequest

if TYPE_CHECKING:
    from loraplex.platform.context import PlatformContext

router = APIRouter(tags=["openai"])
log = logging.getLogger(__name__)


def _missing(response_id: str) -> NotFound:
    return NotFound(f"no response with id {response_id!r}", param="response_id", code="response_not_found")


def _history(ctx: PlatformContext, tenant_id: str, previous: str | None) -> list[dict[str, Any]]:
    if previous is None:
        return []
    with unit_of_work(ctx.sessions) as session:
        row = store.get(session, tenant_id, previous)
        if row is None:
            raise NotFound(f"no response with id {previous!r}", param="previous_response_id", code="response_not_found")
        body = json.loads(row.body)
        return json.loads(row.conversation) + convert.output_as_messages(body["output"])


def _save(ctx: PlatformContext, tenant_id: str, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
    with unit_of_work(ctx.sessions) as session:
        store.put(session, tenant_id, response, conversation)


@router.post("/responses")
async def create_response(body: ResponsesRequest, ctx: ContextDep, tenant: TenantDep):
    body.check()
    history = await run_in_threadpool(_history, ctx, tenant.tenant_id, body.previous_response_id)
    chat, conversation = convert.to_chat(body, history)
    rid = convert.new_id("resp")
    result = await request_path.chat(chat, ctx, tenant)  # refusals are HTTP errors, before any byte
    headers = {k: v for k, v in result.headers.items() if k.startswith(("x-", "retry-after"))}

    async def finish(output: list[dict[str, Any]], chat_usage: dict | None, reason: str | None) -> dict[str, Any]:
        final = convert.response_object(
            body, rid, status="completed", output=output, usage_=convert.usage(chat_usage), finish_reason=reason
        )
        if body.store:
            try:
                await run_in_threadpool(_save, ctx, tenant.tenant_id, final, conversation)
            except SQLAlchemyError as exc:
                # The answer was generated and billed (the usage ledger spools through an outage):
                # a failed store must not turn it into a 503 or cut the stream before
                # response.completed. It is delivered, saying it was not stored.
                log.warning("response %s not stored: %s", rid, str(exc).splitlines()[0][:200])
                final["store"] = False
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
def get_response(response_id: str, session: SessionDep, tenant: TenantDep) -> JSONResponse:
    row = store.get(session, tenant.tenant_id, response_id)
    if row is None:
        raise _missing(response_id)
    return JSONResponse(json.loads(row.body))


@router.delete("/responses/{response_id}")
def delete_response(response_id: str, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    if not store.remove(session, tenant.tenant_id, response_id):
        raise _missing(response_id)
    return {"id": response_id, "object": "response", "deleted": True}
