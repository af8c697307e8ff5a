"""Quotas hold under concurrency: admission reserves prompt + n x max_tokens atomically and the finish
settles to what was served, so 30-50 simultaneous requests cannot overshoot tpm, the token budget,
rpm or max_concurrent (checked against the ledger, an independent record of what was served)."""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timezone

import httpx
import pytest
from billing_helpers import auth, new_tenant, usage_rows

from loraplex.platform.errors import RateLimited
from loraplex.platform.quotas.store import InProcessQuotaStore, QuotaView


async def _burst(url: str, key: str, model: str, n: int, max_tokens: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, headers=auth(key), timeout=120) as c:
        body = {"model": model, "prompt": "Tell me a story", "max_tokens": max_tokens, "temperature": 0}
        return list(await asyncio.gather(*[c.post("/v1/completions", json=body) for _ in range(n)]))


def _served(url: str, tid: str) -> int:
    return sum(r["prompt_tokens"] + r["completion_tokens"] for r in usage_rows(url, tid).values())


@pytest.fixture
def live(live_factory):
    return live_factory()


@pytest.mark.parametrize("quota", [{"tpm": 1000}, {"token_budget": 2000, "budget_period": "day"}])
def test_token_limits_hold_under_30_concurrent_requests(live, quota):
    tid, key = new_tenant(live.url, "acme", quota=quota)
    limit = quota.get("tpm") or quota["token_budget"]
    responses = asyncio.run(_burst(live.url, key, live.ctx.engine.model_name, 30, 200))
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert len(ok) + len(refused) == 30 and ok and refused
    live.ctx.ledger.flush()
    served = _served(live.url, tid)
    client_seen = sum(r.json()["usage"]["total_tokens"] for r in ok)
    assert served == client_seen
    assert served <= limit  # exact in one process (the issue allows 10%)
    assert served >= 0.5 * limit  # and the limit is not wasted by over-reservation of finished requests
    code = "rate_limit_exceeded" if "tpm" in quota else "insufficient_quota"
    assert {r.json()["error"]["code"] for r in refused} == {code}
    assert all(int(r.headers["retry-after"]) >= 1 for r in refused)


def test_rpm_and_concurrency_hold_under_50_concurrent_requests(live):
    model = live.ctx.engine.model_name
    _tid, key = new_tenant(live.url, "rpm", quota={"rpm": 12})
    codes = [r.status_code for r in asyncio.run(_burst(live.url, key, model, 50, 4))]
    assert codes.count(200) == 12 and codes.count(429) == 38
    _tid2, key2 = new_tenant(live.url, "conc", quota={"max_concurrent": 3})
    codes = [r.status_code for r in asyncio.run(_burst(live.url, key2, model, 40, 40))]
    assert 3 <= codes.count(200) <= 40 and codes.count(429) >= 1
    assert set(codes) <= {200, 429}
    assert live.ctx.quotas.running(_tid2) == 0  # every slot came back


def test_reservations_from_many_threads_never_exceed_the_limit():
    """The store itself, hammered by threads: the sum of holds never passes tpm or the budget."""
    store = InProcessQuotaStore(lambda tenant, since: 0)
    quota = QuotaView(tpm=10_000, token_budget=7_000, budget_period="day")
    held, peak, lock = [0], [0], threading.Lock()
    admitted, refused = [0], [0]

    def worker(seed: int) -> None:
        for i in range(200):
            want = 50 + (seed * 31 + i * 17) % 150
            try:
                res = store.reserve("t", quota, want)
            except RateLimited:
                with lock:
                    refused[0] += 1
                continue
            with lock:
                admitted[0] += 1
                held[0] += want
                peak[0] = max(peak[0], held[0])
            used = want // 3
            with lock:
                held[0] -= want
            store.settle(res, used)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert admitted[0] and refused[0]
    st = store._tenants["t"]
    assert st.budget_reserved == 0 and st.running == 0
    assert st.budget_used <= 7_000 and peak[0] <= 7_000
    assert sum(e[1] for e in st.tokens) <= 10_000


def test_cancel_returns_the_rpm_slot_and_settle_returns_unused_tokens():
    store = InProcessQuotaStore(lambda tenant, since: 0, wall=lambda: datetime(2026, 5, 2, tzinfo=timezone.utc))
    q = QuotaView(rpm=1, tpm=300)
    r = store.reserve("t", q, 250)
    store.cancel(r)
    r = store.reserve("t", q, 250)  # the cancelled one used no rpm slot
    with pytest.raises(RateLimited):
        store.reserve("t", q, 10)  # rpm=1 is used now
    store.settle(r, 40)
    q2 = QuotaView(tpm=300)
    store.reserve("t", q2, 260)  # 40 settled + 260 = 300: fits once the unused 210 came back
    with pytest.raises(RateLimited, match="more than the limit"):
        store.reserve("t", q2, 301)
