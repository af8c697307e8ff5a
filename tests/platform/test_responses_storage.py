"""Stored responses are bounded (real uvicorn, the official ``openai`` client, SQLite and
PostgreSQL): OpenAI's metadata limits on /v1/responses and chat completions, no unbounded field
kept with a response, per-tenant count and byte caps (refused before generating; a race past a cap
stores exactly the cap), expiry after the retention (404 at once, deleted by the sweep) and the
tenant's deletion taking its stored responses. The database rows are the oracle for what is kept."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import httpx
import openai
import pytest
from billing_helpers import H, auth, new_tenant
from platform_helpers import make_settings
from sqlalchemy import select, update

from loraplex.platform.app import build_context
from loraplex.platform.db.base import utcnow
from loraplex.platform.inference.responses_api import retention
from loraplex.platform.inference.responses_api.store import StoredResponse

EMOJI = "\U0001f600"  # 4 bytes in UTF-8, one character


def _rows(ctx, tenant_id: str) -> list[StoredResponse]:
    with ctx.sessions() as s:
        return list(s.scalars(select(StoredResponse).where(StoredResponse.tenant_id == tenant_id)))


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


def _bad(call, param: str) -> dict:
    with pytest.raises(openai.BadRequestError) as exc:
        call()
    err = exc.value.body
    assert err["param"] == param or err["param"].startswith(param + "."), err
    return err


def test_metadata_has_openais_limits_on_responses_and_chat(module_tenant_setup):
    ctx, url, tid, key, _, client = module_tenant_setup
    base = ctx.engine.model_name
    before = len(_rows(ctx, tid))
    # the largest allowed: 16 keys of 64 characters, values of 512 four-byte characters
    biggest = {f"{i:02d}" + EMOJI * 62: EMOJI * 512 for i in range(16)}
    r = client.responses.create(model=base, input="hi", max_output_tokens=1, metadata=biggest)
    assert client.responses.retrieve(r.id).metadata == biggest
    [row] = [x for x in _rows(ctx, tid) if x.id == r.id]
    assert 16 * 512 * 4 < row.size_bytes < 16 * 512 * 4 * 3  # metadata is kept once in the body
    too_many = {f"k{i}": "v" for i in range(17)}
    for bad in (
        too_many,
        {"k" * 65: "v"},
        {EMOJI * 65: "v"},  # characters, not bytes: 65 characters is one too many
        {"k": "v" * 513},
        {"k": EMOJI * 513},
        {"k": {"nested": "object"}},
        {"k": 1},
    ):
        _bad(lambda b=bad: client.responses.create(model=base, input="hi", max_output_tokens=1, metadata=b), "metadata")
        chat = dict(model=base, messages=[{"role": "user", "content": "hi"}], max_tokens=1, metadata=bad)
        _bad(lambda c=chat: client.chat.completions.create(**c), "metadata")
    _bad(lambda: client.responses.create(model=base, input="hi", extra_body={"metadata": ["x"]}), "metadata")
    ok = client.chat.completions.create(
        model=base, messages=[{"role": "user", "content": "hi"}], max_tokens=1, metadata=biggest
    )
    assert ok.choices[0].finish_reason is not None
    assert len(_rows(ctx, tid)) == before + 1  # nothing refused was stored


def test_no_unbounded_field_is_stored(module_tenant_setup):
    ctx, url, tid, key, _, client = module_tenant_setup
    base = ctx.engine.model_name
    junk = "j" * (512 * 1024)

    def create(**kw):
        return client.responses.create(model=base, input="hi", **{"max_output_tokens": 1, **kw})

    _bad(lambda: create(text={"format": {"type": "text", "junk": junk}}), "text.format")
    _bad(lambda: create(text={"format": {"type": "text"}, "junk": junk}), "text")
    big = {"type": "object", "properties": {"a": {"type": "string", "description": junk}}}
    _bad(lambda: create(text={"format": {"type": "json_schema", "name": "n", "schema": big}}), "text.format")
    _bad(lambda: create(text={"format": {"type": "json_schema", "name": "n" * 65, "schema": {}}}), "text.format")
    _bad(lambda: create(user="u" * 513), "user")
    _bad(lambda: create(previous_response_id="r" * 65), "previous_response_id")
    tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}, "junk": junk}
    r = create(tools=[tool], tool_choice={"type": "function", "name": "f", "junk": junk}, max_output_tokens=8)
    got = client.responses.retrieve(r.id)
    assert got.tools[0].name == "f" and got.tool_choice.name == "f"
    [row] = [x for x in _rows(ctx, tid) if x.id == r.id]
    assert "junk" not in row.body and row.size_bytes < 64 * 1024
    assert row.size_bytes == len(row.body.encode()) + len(row.conversation.encode())  # the cap's measure
    # text.verbosity (OpenAI's) is accepted
    assert create(text={"format": {"type": "text"}, "verbosity": "low"}).status in ("completed", "incomplete")


def test_per_tenant_count_cap_refuses_before_generating(live_factory):
    live = live_factory(responses={"max_stored_per_tenant": 2})
    tid, key = new_tenant(live.url, "capped")
    client = _client(live.url, key)
    base = live.ctx.engine.model_name
    kept = [client.responses.create(model=base, input="hi", max_output_tokens=1).id for _ in range(2)]
    err = _bad(lambda: client.responses.create(model=base, input="hi", max_output_tokens=1), "store")
    assert err["code"] == "stored_responses_limit_exceeded" and "store: false" in err["message"]
    # streamed: the same refusal, as an HTTP status before any event
    with pytest.raises(openai.BadRequestError):
        list(client.responses.create(model=base, input="hi", max_output_tokens=1, stream=True))
    unstored = client.responses.create(model=base, input="hi", max_output_tokens=1, store=False)
    assert unstored.store is False
    live.ctx.ledger.flush()
    usage = httpx.get(f"{live.url}/admin/v1/usage", params={"tenant_id": tid}, headers=H, timeout=30).json()
    assert usage["totals"]["requests"] == 3  # the two refusals were not billed
    client.responses.delete(kept[0])
    assert client.responses.create(model=base, input="hi", max_output_tokens=1).store is True
    assert len(_rows(live.ctx, tid)) == 2
    # another tenant has its own cap
    _tid2, key2 = new_tenant(live.url, "other")
    assert _client(live.url, key2).responses.create(model=base, input="hi", max_output_tokens=1).store is True


def test_concurrent_requests_store_exactly_the_cap(live_factory):
    live = live_factory(responses={"max_stored_per_tenant": 3})
    tid, key = new_tenant(live.url, "race")
    base = live.ctx.engine.model_name
    answers: list[dict] = []
    gate = threading.Barrier(8)

    def one() -> None:
        gate.wait()
        body = {"model": base, "input": "hi", "max_output_tokens": 2}
        r = httpx.post(f"{live.url}/v1/responses", json=body, headers=auth(key), timeout=300)
        answers.append({**(r.json() if r.status_code == 200 else {}), "http": r.status_code})

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    stored = {a["id"] for a in answers if a["http"] == 200 and a["store"]}
    rows = {r.id for r in _rows(live.ctx, tid)}
    assert rows == stored and len(rows) == 3, (answers, rows)
    # the others were refused up front (400 naming store) or delivered unstored (store: false)
    assert len(answers) == 8
    assert all(a["http"] == 400 or (a["http"] == 200 and (a["id"] in rows) == a["store"]) for a in answers)


def test_byte_cap_delivers_what_does_not_fit_unstored(live_factory):
    live = live_factory(responses={"max_stored_bytes_per_tenant": 20_000})
    tid, key = new_tenant(live.url, "bytes")
    client = _client(live.url, key)
    base = live.ctx.engine.model_name
    meta = {f"k{i}": "v" * 500 for i in range(16)}  # ~8 KB per response
    first = client.responses.create(model=base, input="hi", max_output_tokens=1, metadata=meta)
    second = client.responses.create(model=base, input="hi", max_output_tokens=1, metadata=meta)
    third = client.responses.create(model=base, input="hi", max_output_tokens=1, metadata=meta)
    assert (first.store, second.store, third.store) == (True, True, False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(third.id)
    assert sum(r.size_bytes for r in _rows(live.ctx, tid)) <= 20_000
    small = client.responses.create(model=base, input="hi", max_output_tokens=1)  # what fits is still stored
    assert small.store is True and client.responses.retrieve(small.id).id == small.id


def _age(ctx, response_id: str, by: timedelta) -> None:
    with ctx.sessions() as s, s.begin():
        row = s.get(StoredResponse, response_id)
        assert row is not None
        s.execute(update(StoredResponse).where(StoredResponse.id == response_id).values(created_at=row.created_at - by))


def test_expired_responses_read_as_absent_and_are_swept(live_factory):
    live = live_factory(responses={"retention_days": 1, "sweep_interval_s": 3600})  # one sweep, at start
    tid, key = new_tenant(live.url, "ttl")
    client = _client(live.url, key)
    base = live.ctx.engine.model_name
    old = client.responses.create(model=base, input="hi", max_output_tokens=1)
    fresh = client.responses.create(model=base, input="hi", max_output_tokens=1)
    _age(live.ctx, old.id, timedelta(days=1, seconds=5))
    for call in (
        lambda: client.responses.retrieve(old.id),
        lambda: client.responses.delete(old.id),
        lambda: client.responses.input_items.list(old.id),
        lambda: client.responses.create(model=base, input="x", previous_response_id=old.id, max_output_tokens=1),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert {r.id for r in _rows(live.ctx, tid)} == {old.id, fresh.id}  # absent before any sweep
    # a server whose sweep runs every 0.2 s (on the same database) deletes it
    live_factory(responses={"retention_days": 1, "sweep_interval_s": 0.2})
    deadline = time.time() + 60
    while len(_rows(live.ctx, tid)) > 1 and time.time() < deadline:
        time.sleep(0.1)
    assert {r.id for r in _rows(live.ctx, tid)} == {fresh.id}
    assert client.responses.retrieve(fresh.id).id == fresh.id


def test_sweep_deletes_every_expired_response_in_batches(tmp_path, db_url, demo_engine, monkeypatch):
    # a context without the app: the app's own periodic sweep runs once at its start, and on a
    # loaded machine that first sweep came after the inserts below and took the 7 itself
    ctx, _ = build_context(make_settings(tmp_path, db_url), demo_engine, upgrade_db=False)
    monkeypatch.setattr(retention, "BATCH", 3)
    long_ago = utcnow() - timedelta(days=31)
    with ctx.sessions() as s, s.begin():
        for i in range(7):
            s.add(StoredResponse(id=f"resp_old{i}", tenant_id="t", conversation="[]", body="{}", created_at=long_ago))
        s.add(StoredResponse(id="resp_new", tenant_id="t", conversation="[]", body="{}"))
    try:
        assert retention.sweep_once(ctx) == 7
        assert [r.id for r in _rows(ctx, "t")] == ["resp_new"]
    finally:
        ctx.close()


def test_deleting_a_tenant_deletes_its_stored_responses(live_factory):
    live = live_factory()
    base = live.ctx.engine.model_name
    gone, gone_key = new_tenant(live.url, "gone")
    kept, kept_key = new_tenant(live.url, "kept")
    for k in (gone_key, kept_key):
        for _ in range(2):
            _client(live.url, k).responses.create(model=base, input="hi", max_output_tokens=1, metadata={"a": "b"})
    assert httpx.delete(f"{live.url}/admin/v1/tenants/{gone}", headers=H, timeout=30).status_code in (200, 204)
    assert _rows(live.ctx, gone) == []
    assert len(_rows(live.ctx, kept)) == 2 and all(
        json.loads(r.body)["metadata"] == {"a": "b"} for r in _rows(live.ctx, kept)
    )
