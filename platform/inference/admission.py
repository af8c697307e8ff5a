"""Admission of one tenant request, cheapest refusals first: (key and tenant status were checked by
the dependency) → model resolution and the tenant's quota (``look_up``: one short DB transaction)
→ an adapter by reference fetched and registered (``request_path``, on the event loop: no
connection or thread held while a store answers) → a prompt list that can never fit (400) and
the concurrency / rpm pre-check → per prompt: a character-length bound → text validity →
tokenize → the engine's sampling values (``SamplingRequest``, checked when it was built from the
body) → the atomic quota reservation of ``prompt + n x max_tokens`` (``quotas.rule``) for every
prompt of the request at once (``admit``). Nothing before the reservation consumes a quota slot,
and a request refused after it (by the engine's own checks) gets the whole reservation back."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loraplex.platform.auth import key_scopes
from loraplex.platform.auth.key_cache import TenantAuth
from loraplex.platform.budgets import admission as budget_admission
from loraplex.platform.db.session import unit_of_work
from loraplex.platform.errors import BadRequest
from loraplex.platform.inference import context_window
from loraplex.platform.inference.service import resolve_model
from loraplex.platform.projects.scope import link
from loraplex.platform.quotas import group
from loraplex.platform.quotas import repository as quotas_repo
from loraplex.platform.quotas.rule import request_cost
from loraplex.platform.quotas.store import QuotaView, Reservation

if TYPE_CHECKING:
    from loraplex.engine import SamplingParams
    from loraplex.platform.adapters.models import Adapter
    from loraplex.platform.engine_client import EngineClient
    from loraplex.platform.inference.openai_schemas import _Common


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
    http_request_id: str | None = None  # the x-request-id of the HTTP request it came in (usage record)
    budget: Any = None  # its hold on the budgets in currency (platform/budgets), None: no budget applies

    @property
    def headers(self) -> dict[str, str]:
        return self.reservation.headers


def check_text(texts: list[str], param: str, max_chars: int | None, context: int | None) -> None:
    """Refuse, without tokenizing, text that cannot fit or is not valid Unicode."""
    total = sum(len(t) for t in texts)
    if max_chars is not None and context is not None and total > max_chars:
        raise context_window.too_many_characters(total, max_chars, context, param=param)
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


def context_len(engine: EngineClient) -> int | None:
    """The engine's context length; None where no engine can say yet (a scale-out ingress before
    any replica reported)."""
    try:
        return int(engine.max_model_len)
    except Exception:  # noqa: BLE001 - a remote engine client has no one engine to ask
        return None


@dataclass(frozen=True)
class Target:
    """What the database says about a request: the adapter (None: the base model), the tenant's
    quota and its generation timeout. Read in one short transaction, released before any wait."""

    adapter: Adapter | None
    quota: QuotaView
    timeout_s: float
    budgeted: bool = False  # a budget in currency applies (platform/budgets): held after the quota


def look_up(ctx, auth: TenantAuth, model: str) -> Target:
    """Blocking (DB): run it in a worker thread. Holds a pooled connection only for its queries."""
    with unit_of_work(ctx.sessions) as session:
        adapter = resolve_model(session, ctx, auth, model)
        q = quotas_repo.get(session, auth.tenant_id)
        quota = QuotaView(q.rpm, q.tpm, q.max_concurrent, q.token_budget, q.budget_period) if q else QuotaView()
        timeout_s = (
            q.max_generation_s if q and q.max_generation_s else None
        ) or ctx.settings.limits.generation_timeout_s
        budgeted = budget_admission.applies(session, auth)
    return Target(adapter, quota, float(timeout_s), budgeted)


def precheck(ctx, auth: TenantAuth, target: Target, prompts: int) -> None:
    """Cheap refusals before any tokenizing: a list that can never fit (400), then concurrency and
    rpm as they stand (429; consumes nothing)."""
    if prompts > 1:
        group.never_fits(auth.tenant_id, target.quota, [0] * prompts)
        for scope, quota in key_scopes.own_scopes(auth):
            group.never_fits(scope, quota, [0] * prompts)
    ctx.quotas.precheck(auth.tenant_id, target.quota)
    key_scopes.precheck(ctx.quotas, auth)


@dataclass
class Tokenized:
    prompt_ids: list[int]
    params: SamplingParams
    started: float


def tokenize_prompt(
    ctx,
    auth: TenantAuth,
    endpoint: str,
    texts: list[str],
    tokenize: Callable[[Any], list[int]],
    body: _Common,
    structured_output: tuple[str, str] | None,
) -> Tokenized:
    """Blocking (tokenizer, grammar): run it in a worker thread. The prompt's ids, and the
    engine's ``SamplingParams`` with the ``max_tokens`` that fits (decided here, once)."""
    t0 = time.monotonic()
    param = "messages" if endpoint.startswith("chat") else "prompt"
    context = context_len(ctx.engine)
    check_text(texts, param, ctx.engine.max_prompt_chars(), context)
    prompt_ids = tokenize(ctx.engine.tokenizer)
    if not prompt_ids:
        raise BadRequest("the prompt is empty", param="prompt")
    max_tokens = context_window.max_tokens_for(body.requested_max_tokens(), len(prompt_ids), context, param=param)
    params = body.to_sampling_params(ctx.engine.tokenizer, max_tokens=max_tokens, structured_output=structured_output)
    ctx.engine.check_sampling(params, tenant_id=auth.tenant_id)  # grammar compiles are charged to the tenant
    return Tokenized(prompt_ids, params, t0)


def admit(ctx, auth: TenantAuth, model: str, endpoint: str, target: Target, prompts: list[Tokenized]) -> list[Prepared]:
    """Reserve every prompt's ``request_cost`` at once, against the tenant's limits and the key's
    and project's own (``quotas.group``): the whole list is admitted, or nothing is held."""
    costs = [request_cost(len(p.prompt_ids), p.params.n, p.params.max_tokens) for p in prompts]
    held = group.reserve_all(ctx.quotas, auth.tenant_id, target.quota, costs)
    try:
        for scope, quota in key_scopes.own_scopes(auth):
            for res, own_hold in zip(held, group.reserve_all(ctx.quotas, scope, quota, costs)):
                link(res, own_hold)
    except BaseException:
        for res in held:  # releases the linked holds already taken too
            ctx.quotas.cancel(res)
        raise
    now = time.monotonic()
    return [
        Prepared(
            auth,
            model,
            endpoint,
            target.adapter.id if target.adapter else None,
            p.prompt_ids,
            p.params,
            res,
            target.timeout_s,
            request_id=res.request_id,  # its quota hold (if any) is written under this id
            admission_s=now - p.started,
        )
        for p, res in zip(prompts, held)
    ]
