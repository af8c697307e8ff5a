"""Money + alerts under attack (issue 37 gap round), with real servers and a real webhook receiver:

- a price changed while a stream runs: the stream costs the price in force when it was served
  (admitted), the next request the new one; every reader agrees;
- ``kill -9`` of ``loraplex serve`` mid-stream, with a price, a token budget and a webhook: after
  the restart every request is on record once, the spend export has one line per record at the
  exact cost, the tenant's costs endpoint sums to the same, and the receiver got each event (a
  redelivery under the same id is the one duplicate Standard Webhooks allows)."""

from __future__ import annotations

import csv
import io
import json
import threading
from collections import Counter
from datetime import datetime, timezone
from decimal import Decimal

import httpx
import pytest
from alerts_helpers import SECRET, Receiver
from billing_helpers import H, auth, new_tenant, stream, usage_rows
from harness.wait import wait_for

from loraplex.platform.pricing.money import cost_text

pytestmark = pytest.mark.slow  # live servers, real processes, kill -9


def _price(url: str, model: str, i: str, o: str) -> dict:
    r = httpx.post(
        url + "/admin/v1/prices",
        json={"model": model, "input_per_mtok": i, "cached_input_per_mtok": i, "output_per_mtok": o},
        headers=H,
        timeout=60,
    )
    assert r.status_code == 201, r.text
    return r.json()


def _export(url: str, tid: str) -> list[dict]:
    r = httpx.get(url + "/admin/v1/spend/export", params={"tenant_id": tid}, headers=H, timeout=60)
    assert r.status_code == 200, r.text
    return list(csv.DictReader(io.StringIO(r.text)))


def _micros(text: str) -> int:
    return int(Decimal(text) * 1_000_000)


def test_a_price_changed_mid_stream_charges_the_price_at_serve_time(live_factory):
    live = live_factory()
    base = live.ctx.engine.model_name
    tid, key = new_tenant(live.url, "midstream")
    old = _price(live.url, base, "1", "2")
    changed: list[dict] = []

    def change_once(res) -> None:  # the stream is admitted and running: now the price changes
        if not changed:
            changed.append(_price(live.url, base, "5", "7"))

    first = stream(live.url, key, base, max_tokens=24, ignore_eos=True, on_chunk=change_once)
    assert first.done and changed, first
    second = httpx.post(
        live.url + "/v1/completions",
        json={"model": base, "prompt": "Once upon a time", "max_tokens": 4},
        headers=auth(key),
        timeout=60,
    )
    assert second.status_code == 200
    live.ctx.ledger.flush()
    rows = {r["request_id"]: r for r in _export(live.url, tid)}
    assert set(rows) == {first.request_id, second.json()["id"].removeprefix("cmpl-")}, rows
    a, b = rows[first.request_id], rows.pop(second.json()["id"].removeprefix("cmpl-"))
    assert a["price_id"] == old["id"] and b["price_id"] == changed[0]["id"]
    for row, (i, o) in ((a, (1, 2)), (b, (5, 7))):
        p, c = int(row["prompt_tokens"]), int(row["completion_tokens"])
        assert row["cost"] == cost_text(p * i * 1_000_000 + c * o * 1_000_000), row
    assert int(a["completion_tokens"]) == 24
    start = int(datetime.now(timezone.utc).timestamp()) - 3600
    with httpx.Client(base_url=live.url, headers=auth(key), timeout=30) as t:
        costs = t.get("/v1/organization/costs", params={"start_time": start}).json()
    total = sum(Decimal(r["amount"]["value_exact"]) for bk in costs["data"] for r in bk["results"])
    assert total == Decimal(a["cost"]) + Decimal(b["cost"])


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_kill9_mid_stream_with_prices_budget_and_webhook(backend, request, tmp_path, demo_model_dir, serve_process):
    receiver = Receiver()
    env = {
        "LORAPLEX_LEDGER__CHECKPOINT_INTERVAL_S": "0.3",
        "LORAPLEX_ALERTS__ALLOWED_HOSTS": '["127.0.0.1"]',
        "LORAPLEX_ALERTS__DISPATCH_INTERVAL_S": "0.2",
        "LORAPLEX_ALERTS__LEASE_S": "6",
        "LORAPLEX_ALERTS__DELIVERY_TIMEOUT_S": "3",
    }
    if backend == "postgres":
        env["LORAPLEX_DATABASE_URL"] = request.getfixturevalue("db_url_postgres")
    data = tmp_path / "data"
    server = serve_process(data, demo_model_dir, env=env)
    try:
        tid, key = new_tenant(server.url, "killed", quota={"token_budget": 3000, "budget_period": "day"})
        base = httpx.get(server.url + "/v1/models", headers=auth(key), timeout=60).json()["data"][0]["id"]
        _price(server.url, base, "0.3", "1.2")
        r = httpx.post(server.url + "/admin/v1/webhooks", json={"url": receiver.url, "secret": SECRET}, headers=H)
        assert r.status_code == 201, r.text
        # 50 % reached by two finished requests (each reserves 4 + 400 of 3000 ... then 1.5k held)
        finished = [
            httpx.post(
                server.url + "/v1/completions",
                json={"model": base, "prompt": [5, 6, 7, 8], "max_tokens": 40, "ignore_eos": True},
                headers=auth(key),
                timeout=120,
            )
            for _ in range(2)
        ]
        assert all(f.status_code == 200 for f in finished)
        # three long streams that hold 3 x 504 with the finished ones: past 50 % while they run
        results: list = []
        started = threading.Event()

        def run() -> None:
            def seen(res) -> None:
                if res.chunks >= 5:
                    started.set()

            try:
                results.append(
                    stream(server.url, key, base, max_tokens=500, ignore_eos=True, on_chunk=seen, timeout=120)
                )
            except httpx.HTTPError as exc:  # the server died under it
                results.append(exc)

        threads = [threading.Thread(target=run) for _ in range(3)]
        for t in threads:
            t.start()
        wait_for(started.is_set, timeout=120, what="the streams under way")
        wait_for(
            lambda: any(
                r.get("completion_tokens", 0) > 0 and r["status"] == "running"
                for r in usage_rows(server.url, tid).values()
            ),
            timeout=60,
            what="a checkpoint of a running stream",
        )
        server.kill()
        for t in threads:
            t.join(60)
    finally:
        server.kill()
    again = serve_process(data, demo_model_dir, env=env)
    try:

        def closed() -> dict | None:
            found = usage_rows(again.url, tid)
            return found if all(r["status"] != "running" for r in found.values()) else None

        rows = wait_for(closed, timeout=120, what="the cut streams closed by recovery")
        assert len(rows) == 5, rows  # two finished, three cut: each once
        assert sorted(r["status"] for r in rows.values()).count("ok") == 2
        export = _export(again.url, tid)
        assert Counter(r["request_id"] for r in export) == {rid: 1 for rid in rows}
        for line in export:
            rec = rows[line["request_id"]]
            assert (int(line["prompt_tokens"]), int(line["completion_tokens"])) == (
                rec["prompt_tokens"],
                rec["completion_tokens"],
            )
            units = rec["prompt_tokens"] * 300_000 + rec["completion_tokens"] * 1_200_000
            assert line["cost"] == cost_text(units), line
        start = int(datetime.now(timezone.utc).timestamp()) - 3600
        costs = httpx.get(
            again.url + "/v1/organization/costs", params={"start_time": start}, headers=auth(key), timeout=60
        )
        total = sum(Decimal(r["amount"]["value_exact"]) for bk in costs.json()["data"] for r in bk["results"])
        assert total == sum(Decimal(line["cost"]) for line in export)
        # the alerts: each event stored once, each delivered (at least once, same id)
        events = httpx.get(again.url + "/admin/v1/alerts/events", params={"tenant_id": tid}, headers=H).json()["data"]
        keys = [(e["type"], e["data"]["rule"], e["data"]["threshold_percent"]) for e in events]
        assert Counter(keys) == {k: 1 for k in keys} and ("limit.threshold", "token_budget", 50) in keys, keys
        wait_for(
            lambda: set(receiver.accepted_ids()) >= {e["id"] for e in events},
            timeout=120,
            what="every event delivered",
            details=lambda: json.dumps(receiver.all())[:2000],
        )
        assert all(r["verified"] for r in receiver.all())
    finally:
        again.stop()
        receiver.stop()


def test_postgres_stopped_mid_stream_with_prices_and_alerts(tmp_path, demo_model_dir, private_postgres, serve_process):
    """PostgreSQL stopped while a priced stream runs and restarted after it ended: the stream is
    on record once at its exact cost (its final record spooled through the outage), requests in
    the outage are 503s (never billed, never a 500), and the alerts raised before it are delivered."""
    pg = private_postgres
    receiver = Receiver()
    env = {
        "LORAPLEX_DATABASE_URL": pg.url,
        "LORAPLEX_AUTH__KEY_CACHE_TTL_S": "60",
        "LORAPLEX_ALERTS__ALLOWED_HOSTS": '["127.0.0.1"]',
        "LORAPLEX_ALERTS__DISPATCH_INTERVAL_S": "0.2",
        "LORAPLEX_ALERTS__BACKOFF_BASE_S": "0.2",
        "LORAPLEX_ALERTS__BACKOFF_MAX_S": "1",
    }
    server = serve_process(tmp_path / "data", demo_model_dir, env=env)
    try:
        tid, key = new_tenant(server.url, "outage", quota={"token_budget": 1000, "budget_period": "day"})
        base = httpx.get(server.url + "/v1/models", headers=auth(key), timeout=60).json()["data"][0]["id"]
        _price(server.url, base, "0.3", "1.2")
        r = httpx.post(server.url + "/admin/v1/webhooks", json={"url": receiver.url, "secret": SECRET}, headers=H)
        assert r.status_code == 201, r.text
        results: list = []
        going = threading.Event()
        release = threading.Event()

        def hold(res) -> None:  # 4 + 600 of 1000 reserved: the 50 % threshold is on record
            going.set()
            if res.chunks == 5:
                release.wait(120)  # the database goes down while this stream is mid-way

        t = threading.Thread(
            target=lambda: results.append(
                stream(
                    server.url,
                    key,
                    base,
                    prompt=[5, 6, 7, 8],
                    max_tokens=600,
                    ignore_eos=True,
                    on_chunk=hold,
                    timeout=180,
                )
            )
        )
        t.start()
        wait_for(going.is_set, timeout=120, what="the stream under way")
        pg.stop("immediate")
        wait_for(lambda: httpx.get(server.url + "/ready", timeout=30).status_code == 503, what="/ready to see it")
        release.set()
        t.join(180)
        refused = httpx.post(
            server.url + "/v1/completions",
            json={"model": base, "prompt": "hi", "max_tokens": 2},
            headers=auth(key),
            timeout=60,
        )
        assert refused.status_code == 503 and refused.headers.get("retry-after"), refused.text
        pg.start()
        wait_for(
            lambda: (
                (j := httpx.get(server.url + "/ready", timeout=30).json())["status"] == "ready" and not j["usage_spool"]
            ),
            timeout=60,
            what="ready again, the spool replayed",
        )
        done = results[0]
        assert done.done and done.usage["completion_tokens"] == 600, done
        rows = usage_rows(server.url, tid)
        assert list(rows) == [done.request_id], rows
        export = _export(server.url, tid)
        assert [line["request_id"] for line in export] == [done.request_id]
        assert export[0]["cost"] == cost_text(done.usage["prompt_tokens"] * 300_000 + 600 * 1_200_000)
        events = httpx.get(server.url + "/admin/v1/alerts/events", params={"tenant_id": tid}, headers=H).json()["data"]
        assert [(e["type"], e["data"]["threshold_percent"]) for e in events] == [("limit.threshold", 50)]
        wait_for(lambda: set(receiver.accepted_ids()) == {events[0]["id"]}, timeout=60, what="the event delivered")
    finally:
        server.stop()
        receiver.stop()
