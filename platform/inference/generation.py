"""One tenant request through admission and the engine: resolve the model, tokenize, admit against
the quota, stream the engine's outputs as text deltas, then book usage and release the slot."""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from loraplex.platform.auth.key_cache import TenantAuth
from loraplex.platform.db.session import unit_of_work
from loraplex.platform.errors import BadRequest, ServiceUnavailable
from loraplex.platform.inference.service import resolve_model
from loraplex.platform.observability.metrics import FinishedRequest
from loraplex.platform.quotas import repository as quotas_repo
from loraplex.platform.quotas.limiter import QuotaView, Ticket


@dataclass
class Prepared:
    auth: TenantAuth
    model: str
    endpoint: str
    adapter_id: str | None
    prompt_ids: list[int]
    params: Any
    ticket: Ticket
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    admission_s: float = 0.0  # model resolution, tokenization, grammar compilation, quota admission
    user: str | None = None


@dataclass
class Delta:
    """New text of one choice; ``completion_tokens`` counts every choice of the request so far."""

    text: str
    finish_reason: str | None
    completion_tokens: int
    index: int = 0
    logprobs: list = field(default_factory=list)  # engine TokenLogprobs of this choice's new tokens


def prepare(ctx, auth: TenantAuth, model: str, endpoint: str,
            tokenize: Callable[[Any], list[int]], sampling: dict[str, Any]) -> Prepared:
    """Blocking part (DB, tokenizer): run it in a worker thread."""
    t0 = time.monotonic()
    with unit_of_work(ctx.sessions) as session:
        adapter = resolve_model(session, ctx, auth.tenant_id, model)
        q = quotas_repo.get(session, auth.tenant_id)
        quota = QuotaView(q.rpm, q.tpm, q.max_concurrent, q.token_budget, q.budget_period) if q else QuotaView()
    prompt_ids = tokenize(ctx.gateway.tokenizer)
    if not prompt_ids:
        raise BadRequest("the prompt is empty", param="prompt")
    try:
        params = ctx.gateway.sampling_params(**sampling)
    except ValueError as exc:
        raise BadRequest(str(exc), param=getattr(exc, "param", None)) from None
    ticket = ctx.limiter.admit(auth.tenant_id, quota, len(prompt_ids))
    prep = Prepared(auth, model, endpoint, adapter.id if adapter else None, prompt_ids, params, ticket)
    prep.admission_s = time.monotonic() - t0
    return prep


async def run(ctx, prep: Prepared) -> AsyncIterator[Delta]:
    """Yield text deltas; always books usage and frees the quota slot, aborting on disconnect."""
    start = time.monotonic()
    first_token_at: float | None = None
    completion_tokens = 0
    status = "error"
    finished = False
    try:
        stream = ctx.gateway.submit(
            prep.prompt_ids, prep.params, request_id=prep.request_id, adapter=prep.adapter_id,
            tenant_id=prep.auth.tenant_id, cache_salt=prep.auth.tenant_id,
        )
        done: set[int] = set()
        async for out in stream:  # DELTA outputs: only what is new since the last one
            if out.error:
                raise ServiceUnavailable(f"generation failed: {out.error}")
            completion_tokens += sum(len(c.token_ids) for c in out.outputs)
            if completion_tokens and first_token_at is None:
                first_token_at = time.monotonic()
            finished = out.finished
            for comp in out.outputs:  # n > 1: one delta per choice that moved or ended
                if comp.index in done:
                    continue
                ended = comp.finish_reason is not None or finished
                if ended:
                    done.add(comp.index)
                lps = comp.logprobs or []
                if comp.text or ended or lps:
                    reason = str(comp.finish_reason) if ended and comp.finish_reason is not None else None
                    yield Delta(comp.text, reason, completion_tokens, comp.index, lps)
        status = "ok"
    finally:
        if not finished:
            ctx.gateway.abort(prep.request_id)
            status = "aborted" if status == "error" else status
        prep.ticket.finish(len(prep.prompt_ids) + completion_tokens)
        now = time.monotonic()
        ctx.usage.add(
            tenant_id=prep.auth.tenant_id, api_key_id=prep.auth.key_id, adapter_id=prep.adapter_id,
            adapter_name=prep.model if prep.adapter_id else None, request_id=prep.request_id,
            endpoint=prep.endpoint, prompt_tokens=len(prep.prompt_ids), completion_tokens=completion_tokens,
            ttft_ms=(first_token_at - start) * 1000 if first_token_at else None,
            latency_ms=(now - start) * 1000, status=status,
        )
        ctx.observer.finished(FinishedRequest(
            request_id=prep.request_id, endpoint=prep.endpoint, status=status, tenant_id=prep.auth.tenant_id,
            adapter=prep.model if prep.adapter_id else None, prompt_tokens=len(prep.prompt_ids),
            completion_tokens=completion_tokens, ttft_s=(first_token_at - start) if first_token_at else None,
            latency_s=now - start, admission_s=prep.admission_s, user=prep.user,
            start_unix=time.time() - (now - start) - prep.admission_s))
