"""The control plane's contract under bad input and operator actions, against a real uvicorn on
SQLite and PostgreSQL: cheap refusals, pre-stream errors as HTTP statuses (without using an rpm
slot), lifecycle aborts within a few steps billed as delivered, the generation timeout, soft deletes
that keep usage history, and the CSV / JSON lines export."""

from __future__ import annotations

import csv
import io
import json
import threading
import time

import httpx
import openai
import pytest
from billing_helpers import H, auth, new_adapter, new_tenant, stream, usage_rows
from harness.net import status_before_body
from harness.wait import wait_for

CHUNKS_AFTER_COMMIT = 100


@pytest.fixture
def live(live_factory):
    return live_factory(ledger={"checkpoint_interval_s": 0.2})


def _model(live) -> str:
    return live.ctx.engine.model_name


def test_streaming_prechecks_are_http_errors_and_use_no_rpm_slot(live):
    tid, key = new_tenant(live.url, "acme", quota={"rpm": 2})
    base = _model(live)
    over = stream(live.url, key, base, max_tokens=5000)  # prompt + max_tokens > max_model_len (2048)
    assert over.status == 400 and "context length" in over.error["message"]
    bad_ids = stream(live.url, key, base, prompt=[1, 2, 10**6], max_tokens=4)
    assert bad_ids.status == 400 and bad_ids.error["param"] == "prompt"
    seed = stream(live.url, key, base, max_tokens=4, seed=2**64)
    assert seed.status == 400 and seed.error["param"] == "seed"
    temp = stream(live.url, key, base, max_tokens=4, temperature=7)
    assert temp.status == 400 and temp.error["param"] == "temperature"
    missing = stream(live.url, key, "no-such-model", max_tokens=4)
    assert missing.status == 404
    # none of the refusals above used one of the two requests per minute
    for _ in range(2):
        ok = stream(live.url, key, base, max_tokens=3)
        assert ok.status == 200 and ok.done and ok.usage["completion_tokens"] >= 1
    assert stream(live.url, key, base, max_tokens=3).status == 429
    live.ctx.ledger.flush()
    assert len(usage_rows(live.url, tid)) == 2  # refused requests are not billed


def _count_tokenized_chars(monkeypatch, live) -> list[int]:
    """The length of every text the server's tokenizer encodes from now on (the oracle for "refused
    without tokenizing": a count, not a stopwatch)."""
    tokenizer = live.ctx.engine.tokenizer
    seen: list[int] = []
    encode = tokenizer.encode

    def counting_encode(text, *args, **kwargs):
        seen.append(len(text) if isinstance(text, str) else -1)
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", counting_encode)
    return seen


def test_huge_and_invalid_prompts_are_refused_cheaply(live, monkeypatch):
    _tid, key = new_tenant(live.url, "acme")
    base = _model(live)
    huge = json.dumps({"model": base, "prompt": "a" * (15 * 1024 * 1024), "max_tokens": 1})
    beyond = json.dumps({"model": base, "prompt": "ab " * (1024 * 1024), "max_tokens": 1})
    tokenized = _count_tokenized_chars(monkeypatch, live)
    json_headers = {**auth(key), "content-type": "application/json"}
    # refused on the announced size, before the body is sent (a server reading it first never answers)
    assert status_before_body(live.url, "/v1/completions", json_headers, len(huge), sent=huge[:64].encode()) == 413
    with httpx.Client(base_url=live.url, headers=json_headers, timeout=60) as c:
        r = c.post("/v1/completions", content=huge)
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
        # under the body limit but beyond any context: refused without tokenizing
        r = c.post("/v1/completions", content=beyond)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert not [n for n in tokenized if n >= 1024 * 1024], "a prompt beyond any context was tokenized"
        chat = {"model": base, "max_tokens": 1, "messages": [{"role": "user", "content": "x" * (3 * 1024 * 1024)}]}
        assert c.post("/v1/chat/completions", json=chat).status_code == 400
        raw = b'{"model": "%s", "prompt": "bad \\ud800 text", "max_tokens": 2}' % base.encode()
        r = c.post("/v1/completions", content=raw)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_text"
        # the connection is still usable after refusals, and normal requests work
        assert c.post("/v1/completions", json={"model": base, "prompt": "hi", "max_tokens": 2}).status_code == 200


def test_over_rpm_tenant_is_refused_before_tokenizing(live, monkeypatch):
    _tid, key = new_tenant(live.url, "acme", quota={"rpm": 1})
    base = _model(live)
    tokenized = _count_tokenized_chars(monkeypatch, live)
    with httpx.Client(base_url=live.url, headers=auth(key), timeout=60) as c:
        assert c.post("/v1/completions", json={"model": base, "prompt": "hi", "max_tokens": 1}).status_code == 200
        big = json.dumps({"model": base, "prompt": "word " * 700_000, "max_tokens": 1})  # seconds to tokenize
        r = c.post("/v1/completions", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 429
        assert int(r.headers["retry-after"]) >= 1
    assert tokenized and not [n for n in tokenized if n >= 700_000], "the over-quota prompt was tokenized"


def test_api_key_only_in_authorization_header(live):
    _tid, key = new_tenant(live.url, "acme")
    assert httpx.get(live.url + "/v1/models", params={"api_key": key}).status_code == 401
    assert httpx.get(live.url + "/v1/models", headers=auth(key)).status_code == 200


ACTIONS = {
    "suspend_tenant": lambda c, tid, kid, ada: c.patch(f"/admin/v1/tenants/{tid}", json={"status": "suspended"}),
    "delete_tenant": lambda c, tid, kid, ada: c.delete(f"/admin/v1/tenants/{tid}"),
    "revoke_key": lambda c, tid, kid, ada: c.delete(f"/admin/v1/keys/{kid}"),
    "delete_adapter": lambda c, tid, kid, ada: c.delete(f"/admin/v1/adapters/{ada}"),
}


@pytest.mark.parametrize("action", list(ACTIONS))
def test_lifecycle_change_aborts_in_flight_promptly(live, good_files, action):
    tid, key = new_tenant(live.url, "acme")
    kid = httpx.get(live.url + f"/admin/v1/tenants/{tid}/keys", headers=H).json()["data"][0]["id"]
    ada = new_adapter(live.url, "bot", tid, good_files)
    # a bystander tenant streaming at the same time must not be touched
    _bid, bkey = new_tenant(live.url, "bystander")
    bystander: dict = {}
    t = threading.Thread(target=lambda: bystander.update(r=stream(live.url, bkey, _model(live), max_tokens=60)))
    fired: dict = {}

    def act(res) -> None:  # beside the stream, so that the client keeps reading meanwhile
        with httpx.Client(base_url=live.url, headers=H, timeout=60) as c:
            fired["status"] = ACTIONS[action](c, tid, kid, ada).status_code
        fired["chunks"] = res.chunks  # the change is committed: from here on it must bite

    def on_chunk(res):
        if res.chunks == 5 and "thread" not in fired:
            t.start()
            fired["thread"] = threading.Thread(target=act, args=(res,))
            fired["thread"].start()

    res = stream(live.url, key, "bot", max_tokens=1500, on_chunk=on_chunk)
    assert "thread" in fired, f"stream ended before the action: {res}"
    fired["thread"].join(60)
    assert fired["status"] == 200
    assert res.error and res.error["code"] == "request_cancelled", res
    # Counted, not timed: once committed, the abort reaches the engine within a step or two; a
    # stream that kept going would deliver up to ~1500 more chunks.
    assert res.chunks - fired["chunks"] <= CHUNKS_AFTER_COMMIT, (res.chunks, fired["chunks"])
    assert res.finish_reason is None  # never reported as a normal finish
    t.join(60)
    live.ctx.ledger.flush()
    row = usage_rows(live.url, tid)[res.request_id]
    assert row["status"] == "aborted"
    assert res.chunks <= row["completion_tokens"] < 1500  # what was delivered, not max_tokens
    assert bystander["r"].done and bystander["r"].finish_reason in ("length", "stop")


def test_generation_timeout_ends_with_length_and_is_billed(live):
    tid, key = new_tenant(live.url, "acme", quota={"max_generation_s": 0.5})
    res = stream(live.url, key, _model(live), max_tokens=1500)
    assert res.done and res.finish_reason == "length" and res.chunks < 1500  # cut by the timeout, not max_tokens
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0)
    full = client.completions.create(model=_model(live), prompt="Once upon a time", max_tokens=1500, temperature=0)
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens < 1500
    live.ctx.ledger.flush()
    rows = usage_rows(live.url, tid)
    assert [r["status"] for r in rows.values()] == ["timeout", "timeout"]
    assert rows[res.request_id]["completion_tokens"] >= res.chunks
    assert rows[full.id.removeprefix("cmpl-")]["completion_tokens"] == full.usage.completion_tokens
    assert all(r["latency_ms"] / 1000 > 0.4 for r in rows.values())  # never cut before the 0.5 s limit


def test_soft_deleted_tenant_keeps_its_usage_history_and_exports(live, good_files):
    tid, key = new_tenant(live.url, "acme")
    new_adapter(live.url, "bot", tid, good_files)
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0)
    done = [
        client.completions.create(model=m, prompt="hi", max_tokens=3, temperature=0, user=f"end-user-{i}")
        for i, m in enumerate((_model(live), "bot"))
    ]
    with httpx.Client(base_url=live.url, headers=H, timeout=30) as c:
        assert c.delete(f"/admin/v1/tenants/{tid}").status_code == 200
        assert c.get(f"/admin/v1/tenants/{tid}").status_code == 404
        assert tid not in [t["id"] for t in c.get("/admin/v1/tenants").json()["data"]]
        assert "bot" not in [a["name"] for a in c.get("/admin/v1/adapters").json()["data"]]
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
        # a new tenant cannot take the deleted one's name (usage reports stay unambiguous)
        assert c.post("/admin/v1/tenants", json={"name": "acme"}).status_code == 409
        live.ctx.ledger.flush()
        report = c.get("/admin/v1/usage", params={"tenant_id": tid, "group_by": "adapter"}).json()
        assert {b["key"]: b["requests"] for b in report["data"]} == {"": 1, "bot": 1}
        assert report["totals"]["completion_tokens"] == sum(d.usage.completion_tokens for d in done)
        text = c.get("/admin/v1/usage/export", params={"format": "csv", "tenant_id": tid}).text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert {r["request_id"] for r in rows} == {d.id.removeprefix("cmpl-") for d in done}
    assert {r["adapter_name"] for r in rows} == {"", "bot"} and {r["status"] for r in rows} == {"ok"}
    assert {r["adapter_name"]: r["user"] for r in rows} == {"": "end-user-0", "bot": "end-user-1"}  # OpenAI `user`
    assert sorted(int(r["completion_tokens"]) for r in rows) == sorted(d.usage.completion_tokens for d in done)


def test_deleting_adapter_and_tenant_mid_traffic_loses_no_other_record(live, good_files):
    victim, vkey = new_tenant(live.url, "victim")
    new_adapter(live.url, "vbot", victim, good_files)
    others = [new_tenant(live.url, f"other{i}") for i in range(2)]
    sent: dict[str, list] = {"ok": [], "refused": []}
    stop = threading.Event()
    lock = threading.Lock()

    def traffic(key, model):
        c = openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0, timeout=60)
        while not stop.is_set():
            try:
                r = c.completions.create(model=model, prompt="hello", max_tokens=4, temperature=0)
                with lock:
                    sent["ok"].append((r.id.removeprefix("cmpl-"), r.usage.completion_tokens))
            except openai.APIStatusError:
                with lock:
                    sent["refused"].append(1)
                time.sleep(0.02)

    threads = [threading.Thread(target=traffic, args=(vkey, "vbot"))] + [
        threading.Thread(target=traffic, args=(k, _model(live))) for _, k in others for _ in range(2)
    ]
    for t in threads:
        t.start()

    def answered() -> int:
        with lock:
            return len(sent["ok"]) + len(sent["refused"])

    wait_for(lambda: len(sent["ok"]) > 10, what="traffic from every client")
    with httpx.Client(base_url=live.url, headers=H, timeout=30) as c:
        ada = c.get("/admin/v1/adapters").json()["data"][0]["id"]
        assert c.delete(f"/admin/v1/adapters/{ada}").status_code == 200
        wait_for(lambda: sent["refused"], what="a request refused after the adapter was deleted")
        assert c.delete(f"/admin/v1/tenants/{victim}").status_code == 200
    after = answered()
    wait_for(lambda: answered() >= after + 8, what="traffic after the tenant was deleted")
    stop.set()
    for t in threads:
        t.join(60)
    live.ctx.ledger.flush()
    rows = usage_rows(live.url)
    assert len(sent["ok"]) > 10 and sent["refused"]
    for rid, completion in sent["ok"]:
        assert rid in rows, f"completed request {rid} has no usage record"
        assert rows[rid]["completion_tokens"] == completion and rows[rid]["status"] == "ok"
    assert live.ctx.ledger.stats.rejected == 0


def test_dead_engine_answers_503_and_ready_says_why(live_factory, demo_model_dir, tmp_path):
    from loraplex.platform.engine_client import LocalEngineClient
    from loraplex.platform.settings import load_settings

    gw = LocalEngineClient.start(
        load_settings(
            data_dir=tmp_path / "own-engine",
            engine={"model": str(demo_model_dir), "max_num_seqs": 2, "kv_cache_memory_gb": 0.02},
        )
    )
    try:
        live = live_factory(gw=gw)
        _tid, key = new_tenant(live.url, "acme")
        assert httpx.get(live.url + "/ready").json() == {
            "status": "ready",
            "engine": "alive",
            "database": "reachable",
            "usage_spool": False,
            "in_flight": 0,
        }
        gw.engine.shutdown()  # the engine loop is gone; the process still answers
        health = httpx.get(live.url + "/health")  # liveness fails too: the process is about to exit
        assert health.status_code == 503 and health.json()["status"] == "engine_dead"
        ready = httpx.get(live.url + "/ready")
        assert ready.status_code == 503 and ready.json()["engine"] == "dead"
        for is_stream in (False, True):
            r = httpx.post(
                live.url + "/v1/completions",
                headers=auth(key),
                json={"model": gw.model_name, "prompt": "hi", "max_tokens": 2, "stream": is_stream},
            )
            assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
            assert int(r.headers["retry-after"]) >= 1
    finally:
        gw.shutdown()
