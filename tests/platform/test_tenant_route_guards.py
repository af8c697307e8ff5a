"""Every tenant route, taken from the app's route table, holds a key's model scope and its rpm
(real uvicorn, SQLite and PostgreSQL): a key limited to one model gets 403 or 404 for any other
model and for stored responses it did not create, and a key with rpm 2 gets 429 on its third call
of any route. A route added without a case here fails ``test_every_tenant_route_has_a_case``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx
import pytest
from billing_helpers import H, auth
from fastapi.routing import APIRoute, iter_route_contexts

from loraplex.platform.app import TENANT_PREFIXES, api_app
from loraplex.platform.deps import require_admin, require_tenant


@dataclass
class Env:
    url: str
    base: str
    tid: str
    full: str  # an unscoped key without limits of its own
    scoped: str  # allowed_models=["bot"] (the module's adapter)
    other_resp: str  # stored by ``full`` with the base model (outside the scope)
    bot_resp: str  # stored by ``full`` with "bot" (in the scope, but another key's)
    own_resp: str  # stored by ``scoped`` with "bot"

    def key(self, **scope) -> str:
        r = httpx.post(f"{self.url}/admin/v1/tenants/{self.tid}/keys", json=scope, headers=H, timeout=30)
        assert r.status_code == 201, r.text
        return r.json()["key"]

    def respond(self, key: str, model: str) -> str:
        body = {"model": model, "input": "hi", "max_output_tokens": 1}
        r = httpx.post(f"{self.url}/v1/responses", json=body, headers=auth(key), timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["id"]


Request = tuple[str, str, dict]  # method, path, httpx keyword arguments


@dataclass
class Case:
    ok: Callable[[Env, str], Request]  # a request of ``key`` that succeeds (its first call)
    # the scoped key reaching outside its scope, and the status it gets
    outside: Callable[[Env], Request]
    outside_status: int
    inside: Callable[[Env], Request]  # the scoped key inside its scope: 200


def _gen(model_field: str, path: str, extra: dict) -> Case:
    def body(model: str) -> dict:
        return {model_field: model, **extra}

    return Case(
        ok=lambda e, k: ("POST", path, {"json": body(e.base)}),
        outside=lambda e: ("POST", path, {"json": body(e.base)}),
        outside_status=403,
        inside=lambda e: ("POST", path, {"json": body("bot")}),
    )


CASES: dict[tuple[str, str], Case] = {
    ("GET", "/v1/models"): Case(
        ok=lambda e, k: ("GET", "/v1/models", {}),
        outside=lambda e: ("GET", f"/v1/models/{e.base}", {}),  # the list is checked separately
        outside_status=404,
        inside=lambda e: ("GET", "/v1/models", {}),
    ),
    ("GET", "/v1/models/{model_id:path}"): Case(
        ok=lambda e, k: ("GET", f"/v1/models/{e.base}", {}),
        outside=lambda e: ("GET", f"/v1/models/{e.base}", {}),
        outside_status=404,
        inside=lambda e: ("GET", "/v1/models/bot", {}),
    ),
    ("POST", "/tokenize"): _gen("model", "/tokenize", {"prompt": "hi"}),
    ("POST", "/detokenize"): _gen("model", "/detokenize", {"tokens": [1, 2]}),
    ("POST", "/v1/completions"): _gen("model", "/v1/completions", {"prompt": "hi", "max_tokens": 1}),
    ("POST", "/v1/chat/completions"): _gen(
        "model", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    ),
    ("POST", "/v1/responses"): _gen("model", "/v1/responses", {"input": "hi", "max_output_tokens": 1}),
    ("GET", "/v1/responses/{response_id}"): Case(
        ok=lambda e, k: ("GET", f"/v1/responses/{e.other_resp}", {}),
        outside=lambda e: ("GET", f"/v1/responses/{e.bot_resp}", {}),
        outside_status=404,
        inside=lambda e: ("GET", f"/v1/responses/{e.own_resp}", {}),
    ),
    ("DELETE", "/v1/responses/{response_id}"): Case(
        ok=lambda e, k: ("DELETE", f"/v1/responses/{e.respond(e.full, e.base)}", {}),
        outside=lambda e: ("DELETE", f"/v1/responses/{e.bot_resp}", {}),
        outside_status=404,
        inside=lambda e: ("DELETE", f"/v1/responses/{e.respond(e.scoped, 'bot')}", {}),
    ),
    ("GET", "/v1/responses/{response_id}/input_items"): Case(
        ok=lambda e, k: ("GET", f"/v1/responses/{e.other_resp}/input_items", {}),
        outside=lambda e: ("GET", f"/v1/responses/{e.other_resp}/input_items", {}),
        outside_status=404,
        inside=lambda e: ("GET", f"/v1/responses/{e.own_resp}/input_items", {}),
    ),
}


def _org(path: str) -> Case:
    """The tenant's own usage / costs (OpenAI's shapes): a scoped key reads its models only."""
    return Case(
        ok=lambda e, k: ("GET", path, {"params": {"start_time": 0}}),
        outside=lambda e: ("GET", path, {"params": {"start_time": 0, "models": e.base}}),
        outside_status=403,
        inside=lambda e: ("GET", path, {"params": {"start_time": 0, "models": "bot"}}),
    )


CASES[("GET", "/v1/organization/usage/completions")] = _org("/v1/organization/usage/completions")
CASES[("GET", "/v1/organization/costs")] = _org("/v1/organization/costs")


def _uses(dependant, call) -> bool:
    return any(d.call is call or _uses(d, call) for d in dependant.dependencies)


def routes_using(app, call) -> set[tuple[str, str]]:
    out = set()
    for rc in iter_route_contexts(app.routes):
        if isinstance(rc.original_route, APIRoute) and rc.dependant is not None and _uses(rc.dependant, call):
            out |= {(method, rc.path) for method in rc.methods or ()}
    return out


def all_routes(app) -> set[tuple[str, str]]:
    return {(m, rc.path) for rc in iter_route_contexts(app.routes) if rc.path for m in rc.methods or ()}


def tenant_routes(app) -> set[tuple[str, str]]:
    """(method, path) of every route that authenticates a tenant key (FastAPI includes routers
    lazily: ``iter_route_contexts`` walks them with their prefixes)."""
    return routes_using(app, require_tenant)


@pytest.fixture(scope="module")
def env(module_tenant_setup):
    """The module's server and tenant (adapter "bot"), a key scoped to "bot" and three stored
    responses; ``app``: the route table every server of this process serves."""
    ctx, url, tid, key, _ada, _client = module_tenant_setup
    e = Env(url, ctx.engine.model_name, tid, key, "", "", "", "")
    e.scoped = e.key(allowed_models=["bot"])
    e.other_resp, e.bot_resp = e.respond(e.full, e.base), e.respond(e.full, "bot")
    e.own_resp = e.respond(e.scoped, "bot")
    e.app = api_app()  # type: ignore[attr-defined]
    return e


def _call(e: Env, key: str, req: Request) -> httpx.Response:
    method, path, kwargs = req
    return httpx.request(method, e.url + path, headers=auth(key), timeout=120, **kwargs)


def test_every_tenant_route_has_a_case(env):
    routes = tenant_routes(env.app)
    assert ("GET", "/v1/responses/{response_id}/input_items") in routes  # the walk finds nested ones
    assert routes == set(CASES), f"tenant routes without a case: {routes - set(CASES)}; stale: {set(CASES) - routes}"
    # and no route under the tenant API's prefixes escapes authentication (vLLM's adapter
    # routes under /v1 take the admin key)
    prefixed = {r for r in all_routes(env.app) if r[1].startswith(TENANT_PREFIXES)}
    assert prefixed <= routes | routes_using(env.app, require_admin), prefixed - routes


@pytest.mark.parametrize("route", sorted(CASES), ids=lambda r: f"{r[0]} {r[1]}")
def test_a_scoped_key_stays_in_its_scope(env, route):
    case = CASES[route]
    r = _call(env, env.scoped, case.outside(env))
    assert r.status_code == case.outside_status, r.text
    err = r.json()["error"]
    assert err["code"] in ("model_not_allowed", "model_not_found", "response_not_found"), err
    inside = _call(env, env.scoped, case.inside(env))
    assert inside.status_code == 200, inside.text
    if route == ("GET", "/v1/models"):
        assert {m["id"] for m in inside.json()["data"]} == {"bot"}
    # nothing the scoped key tried outside its scope changed what the tenant stores
    for rid in (env.other_resp, env.bot_resp):
        assert _call(env, env.full, ("GET", f"/v1/responses/{rid}", {})).status_code == 200


@pytest.mark.parametrize("route", sorted(CASES), ids=lambda r: f"{r[0]} {r[1]}")
def test_a_key_at_rpm_2_is_refused_its_third_call(env, route):
    case = CASES[route]
    key = env.key(rpm=2)
    first = _call(env, key, case.ok(env, key))
    assert first.status_code == 200, first.text
    second = _call(env, key, case.ok(env, key))
    assert second.status_code in (200, 404), second.text  # a DELETE of the same id again: 404, counted
    third = _call(env, key, case.ok(env, key))
    assert third.status_code == 429, third.text
    assert third.json()["error"]["code"] == "rate_limit_exceeded" and int(third.headers["retry-after"]) >= 1
    # the key's limit is its own: an unlimited key of the same tenant still gets through
    assert _call(env, env.full, case.ok(env, env.full)).status_code == 200


def test_the_tenant_rpm_counts_every_route_and_a_refused_key_does_not_use_it(env):
    with httpx.Client(base_url=env.url, headers=H, timeout=30) as c:
        tid = c.post("/admin/v1/tenants", json={"name": "rpm3"}).json()["id"]
        assert c.put(f"/admin/v1/tenants/{tid}/quota", json={"rpm": 3}).status_code == 200
        one = c.post(f"/admin/v1/tenants/{tid}/keys", json={"rpm": 1}).json()["key"]
        free = c.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"]
    models = ("GET", "/v1/models", {})
    assert _call(env, one, models).status_code == 200  # the tenant's first
    for _ in range(4):  # refused by the key's own limit: the tenant's other two stay free
        assert _call(env, one, models).status_code == 429
    tokenize = ("POST", "/tokenize", {"json": {"model": env.base, "prompt": "hi"}})
    assert _call(env, free, tokenize).status_code == 200
    assert _call(env, free, ("GET", f"/v1/models/{env.base}", {})).status_code == 200
    r = _call(env, free, ("POST", "/v1/completions", {"json": {"model": env.base, "prompt": "hi", "max_tokens": 1}}))
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
