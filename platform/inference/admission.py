"""Admission of one tenant request, cheapest refusals first: (key and tenant status were checked by
the dependency) → model resolution and the tenant's quota (one DB read) → concurrency / rpm
pre-check → a character-length bound → text validity → tokenize → the engine's sampling values
(``SamplingRequest``, checked when it was built from the body) → the atomic
quota reservation of ``prompt + n x max_tokens`` (``quotas.rule``). Nothing before the reservation consumes a quota slot,
and a request refused after it (by the engine's own checks) gets the whole reservation back."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from loraplex.platform.auth import key_scopes
from loraplex.platform.auth.key_cache import TenantAuth
from loraplex.platform.db.session import unit_of_work
from loraplex.platform.errors import BadRequest
from loraplex.platform.inference.service import resolve_model
from loraplex.platform.quotas import repository as quotas_repo
from loraplex.platform.quotas.rule import request_cost
from loraplex.platform.quotas.store import QuotaView, Reservation

if TYPE_CHECKING:
    from loraplex.engine import SamplingParams
    from loraplex.platform.inference.sampling_request import SamplingRequest

DEFAULT_MAX_TOKENS = 256  # chat without max_tokens when the engine's context length is unknown


@dataclass
class Prepared:
    auth: TenantAuth
    model: str
    endpoint: str
    adapter_id: str | None
    prompt_ids: list[int]
    params: SamplingParams
    reservation: Reservation
    timeout_s: float
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    started: float = field(default_factory=time.monotonic)
    admission_s: float = 0.0  # model resolution, tokenization, grammar compilation, quota admission
    user: str | None = None  # the OpenAI ``user`` field (logs and traces)

    @property
    def headers(self) -> dict[str, str]:
        return self.reservation.headers


def check_text(texts: list[str], param: str, max_chars: int | None) -> None:
    """Refuse, without tokenizing, text that cannot fit or is not valid Unicode."""
    total = sum(len(t) for t in texts)
    if max_chars is not None and total > max_chars:
        raise BadRequest(
            f"the prompt has {total} characters; it cannot fit the model's context (at most {max_chars} characters)",
            param=param,
            code="context_length_exceeded",
        )
    for t in texts:
        try:
            t.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise BadRequest(
                f"the text is not valid Unicode (a lone surrogate at position {exc.start})",
                param=param,
                code="invalid_text",
            ) from None


def chat_texts(messages: list[Any], tools: list[Any] | None = None) -> list[str]:
    """Every text of chat messages that the template will carry: contents, names, the assistant
    tool calls' names and arguments (a huge ``tool_calls`` list is bounded like huge content), and
    the tool definitions (name, description, parameter schema as the JSON a template renders)."""
    texts: list[str] = []
    for i, tool in enumerate(tools or ()):
        f = tool.function
        texts.append(f.name or "")
        texts.append(f.description or "")
        if f.parameters:
            try:
                texts.append(json.dumps(f.parameters, ensure_ascii=False))
            except (ValueError, RecursionError):  # circular or nested past the interpreter's depth
                raise BadRequest(
                    "the tool's parameters schema cannot be rendered", param=f"tools[{i}].function.parameters"
                ) from None
    for m in messages:
        if isinstance(m.content, str):
            texts.append(m.content)
        elif m.content:
            texts.extend(p.text or "" for p in m.content)
        if m.name:
            texts.append(m.name)
        for call in m.tool_calls or ():
            texts.append(call.function.name or "")
            texts.append(call.function.arguments or "")
    return texts


def _context_len(gateway: Any) -> int | None:
    try:
        return int(gateway.max_model_len)
    except Exception:  # noqa: BLE001 - a remote gateway has no one engine to ask: the fixed default
        return None


def prepare(
    ctx,
    auth: TenantAuth,
    model: str,
    endpoint: str,
    texts: list[str],
    tokenize: Callable[[Any], list[int]],
    sampling: SamplingRequest,
) -> Prepared:
    """Blocking part (DB, tokenizer): run it in a worker thread."""
    t0 = time.monotonic()
    with unit_of_work(ctx.sessions) as session:
        adapter = resolve_model(session, ctx, auth, model)
        q = quotas_repo.get(session, auth.tenant_id)
        quota = QuotaView(q.rpm, q.tpm, q.max_concurrent, q.token_budget, q.budget_period) if q else QuotaView()
        timeout_s = (
            q.max_generation_s if q and q.max_generation_s else None
        ) or ctx.settings.limits.generation_timeout_s
    ctx.quotas.precheck(auth.tenant_id, quota)
    key_scopes.precheck(ctx.quotas, auth)
    check_text(texts, "messages" if endpoint.startswith("chat") else "prompt", ctx.gateway.max_prompt_chars())
    prompt_ids = tokenize(ctx.gateway.tokenizer)
    if not prompt_ids:
        raise BadRequest("the prompt is empty", param="prompt")
    if sampling.max_tokens is None:  # chat's default (OpenAI, vLLM): what is left of the context
        context = _context_len(ctx.gateway)
        sampling = sampling.with_max_tokens(max(1, context - len(prompt_ids)) if context else DEFAULT_MAX_TOKENS)
    try:
        params = ctx.gateway.sampling_params(request=replace(sampling, tenant_id=auth.tenant_id))
    except ValueError as exc:
        raise BadRequest(str(exc), param=getattr(exc, "param", None)) from None
    cost = request_cost(len(prompt_ids), params.n, params.max_tokens)
    reservation = ctx.quotas.reserve(auth.tenant_id, quota, cost)
    key_scopes.reserve(ctx.quotas, auth, reservation, cost)
    return Prepared(
        auth,
        model,
        endpoint,
        adapter.id if adapter else None,
        prompt_ids,
        params,
        reservation,
        float(timeout_s),
        request_id=reservation.request_id,  # its quota hold (if any) is written under this id
        admission_s=time.monotonic() - t0,
    )
