"""Quotas hold for every request shape: a request may consume ``prompt + n x max_tokens`` per
prompt, and that one rule (``quotas.rule.request_cost``) is what admission reserves, so n > 1 and
prompt lists cannot serve more than tpm or the token budget. The ledger (an independent record of
what was served) is the oracle; every reservation comes back (no slot or hold left taken)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from billing_helpers import auth, new_tenant, usage_rows
from harness.examples import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loraplex.platform.errors import RateLimited
from loraplex.platform.quotas.rule import request_cost
from loraplex.platform.quotas.store import InProcessQuotaStore, QuotaView


async def _burst(url: str, key: str, bodies: list[dict], chat: bool = False) -> list[httpx.Response]:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    async with httpx.AsyncClient(base_url=url, headers=auth(key), timeout=300) as c:
        return list(await asyncio.gather(*[c.post(path, json=b) for b in bodies]))


def _served(url: str, tid: str) -> int:
    return sum(r["prompt_tokens"] + r["completion_tokens"] for r in usage_rows(url, tid).values())


@pytest.fixture
def live(live_factory):
    return live_factory()


@pytest.mark.parametrize("quota", [{"tpm": 600}, {"token_budget": 600, "budget_period": "day"}])
def test_n_is_reserved_12_concurrent_n8_requests(live, quota):
    """The issue's 40 x n=16 vs tpm=2000 case, scaled to this box: 12 concurrent n=8 requests of
    16 tokens each would serve ~1,600 tokens if admission reserved prompt + max_tokens only."""
    tid, key = new_tenant(live.url, "n-shape", quota=quota)
    model = live.ctx.engine.model_name
    body = {"model": model, "prompt": "Tell me a story", "max_tokens": 16, "n": 8, "ignore_eos": True}
    responses = asyncio.run(_burst(live.url, key, [body] * 12))
    ok = [r for r in responses if r.status_code == 200]
    assert ok and {r.status_code for r in responses} <= {200, 429}
    assert all(len(r.json()["choices"]) == 8 for r in ok)
    live.ctx.ledger.flush()
    served = _served(live.url, tid)
    assert served == sum(r.json()["usage"]["total_tokens"] for r in ok)
    assert served <= 600, f"served {served} tokens against a limit of 600"
    assert live.ctx.quotas.running(tid) == 0


def test_prompt_lists_with_n_and_chat_n_are_reserved(live):
    tid, key = new_tenant(live.url, "lists", quota={"tpm": 500})
    model = live.ctx.engine.model_name
    listed = {"model": model, "prompt": ["Once", "Upon a", "Time"], "max_tokens": 8, "n": 4, "ignore_eos": True}
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "n": 6}
    responses = asyncio.run(_burst(live.url, key, [listed] * 4))
    responses += asyncio.run(_burst(live.url, key, [chat] * 4, chat=True))
    ok = [r for r in responses if r.status_code == 200]
    assert {r.status_code for r in responses} <= {200, 429} and ok
    live.ctx.ledger.flush()
    served = _served(live.url, tid)
    assert served == sum(r.json()["usage"]["total_tokens"] for r in ok)
    assert served <= 500
    assert live.ctx.quotas.running(tid) == 0


def test_a_request_larger_than_the_limit_is_refused_naming_n(live):
    _tid, key = new_tenant(live.url, "big-n", quota={"tpm": 100})
    body = {"model": live.ctx.engine.model_name, "prompt": "hi", "max_tokens": 16, "n": 8}
    r = httpx.post(live.url + "/v1/completions", json=body, headers=auth(key), timeout=60)
    assert r.status_code == 429 and "n x max_tokens" in r.json()["error"]["message"]


# -- the rule and the store, as a property --------------------------------------------------------

shapes = st.lists(
    st.tuples(
        st.lists(st.integers(1, 60), min_size=1, max_size=4),  # prompt token counts (a prompt list)
        st.integers(1, 8),  # n
        st.integers(1, 64),  # max_tokens
        st.floats(0, 1),  # fraction of n x max_tokens each prompt really generates
        st.booleans(),  # refused after reserving (engine validation): cancelled instead of settled
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes=shapes, tpm=st.integers(50, 3000), budget=st.integers(50, 3000), concurrent=st.integers(1, 8))
def test_served_never_exceeds_the_limits_for_any_request_shapes(shapes, tpm, budget, concurrent):
    """Interleaved admissions and finishes of random shapes: whatever is admitted, what is served
    stays within tpm and the budget (each request serves at most what it reserved), and once every
    request ended no hold, slot or budget reservation remains."""
    store = InProcessQuotaStore(lambda tenant, since: 0, clock=lambda: 0.0)
    quota = QuotaView(tpm=tpm, max_concurrent=concurrent, token_budget=budget, budget_period="day")
    served = 0
    live: list[tuple[list, int]] = []
    for prompts, n, max_tokens, frac, refused in shapes:
        held = []
        try:
            for p in prompts:  # one reservation per prompt, as the API admits a prompt list
                cost = request_cost(p, n, max_tokens)
                assert cost == p + n * max_tokens
                held.append((store.reserve("t", quota, cost), p + int(frac * n * max_tokens)))
        except RateLimited:
            for res, _ in held:
                store.cancel(res)
            held = []
        if refused:
            for res, _ in held:
                store.cancel(res)
        else:
            live.extend(held)
        if len(live) > 2:  # finish the oldest ones, leaving some running across admissions
            for res, used in live[:2]:
                assert used <= res.tokens
                store.settle(res, used)
                served += used
            live = live[2:]
    for res, used in live:
        store.settle(res, used)
        served += used
    assert served <= min(tpm, budget)
    st_ = store._tenants["t"]
    assert st_.running == 0 and st_.budget_reserved == 0 and st_.budget_used == served
    assert sum(e[1] for e in st_.tokens) == served
