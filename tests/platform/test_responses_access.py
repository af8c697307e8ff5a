"""Who reads a stored response, and how (real uvicorn, the official ``openai`` client, SQLite and
PostgreSQL): ``input_items`` pages through the conversation as OpenAI does (``after``, ``limit``,
``order``), a key limited to some models sees only the responses it created for them (also as a
``previous_response_id``), another tenant sees nothing, and chains survive the deletion of a link.
The oracle is what the test sent: the conversation's texts in order."""

from __future__ import annotations

import httpx
import openai
import pytest
from billing_helpers import H, auth


def _key(url: str, tid: str, **scope) -> dict:
    r = httpx.post(f"{url}/admin/v1/tenants/{tid}/keys", json=scope, headers=H, timeout=30)
    assert r.status_code == 201, r.text
    return r.json()


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


def _texts(items) -> list[tuple[str, str]]:
    out = []
    for it in items:
        if it.type == "message":
            out.append((it.role, "".join(p.text for p in it.content)))
        elif it.type == "function_call":
            out.append(("call", f"{it.name}:{it.arguments}"))
        else:
            out.append(("output", it.output))
    return out


def test_input_items_page_through_the_conversation(module_tenant_setup):
    ctx, url, tid, key, _, client = module_tenant_setup
    base = ctx.engine.model_name
    first_input = [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "input_text", "text": "one"}, {"type": "input_text", "text": "+two"}]},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"q": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "found"},
    ]
    a = client.responses.create(model=base, input=first_input, instructions="not an item", max_output_tokens=3)
    b = client.responses.create(model=base, input="three", previous_response_id=a.id, max_output_tokens=2)
    expected = [
        ("developer", "Answer briefly."),
        ("user", "one+two"),
        ("call", 'lookup:{"q": 1}'),
        ("output", "found"),
        ("assistant", a.output_text),
        ("user", "three"),
    ]
    # every page of two, ascending, through the client's own cursor (after = the last id)
    pages = client.responses.input_items.list(b.id, limit=2, order="asc")
    assert _texts(pages) == expected  # auto-pagination walks every page
    first = client.responses.input_items.list(b.id, limit=2, order="asc")
    assert len(first.data) == 2 and first.has_more and first.last_id == first.data[-1].id
    ids = [it.id for it in client.responses.input_items.list(b.id, limit=100, order="asc").data]
    assert len(set(ids)) == len(ids) == 6
    # the default order is descending, 20 per page
    newest = client.responses.input_items.list(b.id)
    assert _texts(newest.data) == expected[::-1] and not newest.has_more
    after = client.responses.input_items.list(b.id, after=ids[3], order="asc")
    assert [it.id for it in after.data] == ids[4:]
    assert client.responses.input_items.list(b.id, after=ids[-1], order="asc").data == []
    assert _texts(client.responses.input_items.list(a.id, order="asc")) == expected[:4]
    for bad in ({"limit": 0}, {"limit": 101}, {"order": "sideways"}, {"after": "msg_nope"}):
        r = httpx.get(f"{url}/v1/responses/{b.id}/input_items", params=bad, headers=auth(key), timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(bad)), r.text
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_nope")


def test_a_scoped_key_sees_only_its_own_responses_of_its_models(module_tenant_setup):
    ctx, url, tid, key, _, full = module_tenant_setup
    base = ctx.engine.model_name
    both = _key(url, tid, allowed_models=["bot", base])
    mine = _client(url, both["key"])
    own_base = mine.responses.create(model=base, input="mine", max_output_tokens=1)
    own_bot = mine.responses.create(model="bot", input="mine too", max_output_tokens=1)
    theirs = full.responses.create(model="bot", input="theirs", max_output_tokens=1)
    # an unscoped key of the tenant sees every stored response (OpenAI's project-wide store)
    assert {full.responses.retrieve(r.id).id for r in (own_base, own_bot, theirs)} == {
        own_base.id,
        own_bot.id,
        theirs.id,
    }
    # the scoped key: its own, not another key's (even of a model in its scope), in every use
    assert mine.responses.retrieve(own_bot.id).id == own_bot.id
    for call in (
        lambda: mine.responses.retrieve(theirs.id),
        lambda: mine.responses.input_items.list(theirs.id),
        lambda: mine.responses.delete(theirs.id),
        lambda: mine.responses.create(model="bot", input="x", previous_response_id=theirs.id, max_output_tokens=1),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    follow = mine.responses.create(model="bot", input="x", previous_response_id=own_base.id, max_output_tokens=1)
    assert follow.previous_response_id == own_base.id
    # narrowed to "bot": its own response of the base model is out of its scope now
    narrowed = httpx.put(f"{url}/admin/v1/keys/{both['id']}/scope", json={"allowed_models": ["bot"]}, headers=H)
    assert narrowed.status_code == 200, narrowed.text
    with pytest.raises(openai.NotFoundError):
        mine.responses.retrieve(own_base.id)
    with pytest.raises(openai.NotFoundError):
        mine.responses.create(model="bot", input="x", previous_response_id=own_base.id, max_output_tokens=1)
    assert mine.responses.retrieve(own_bot.id).id == own_bot.id
    assert full.responses.retrieve(theirs.id).id == theirs.id  # nothing the scoped key did removed it


def test_another_tenant_reaches_nothing(module_tenant_setup):
    ctx, url, tid, key, _, client = module_tenant_setup
    base = ctx.engine.model_name
    r = client.responses.create(model=base, input="secret", max_output_tokens=1)
    other = httpx.post(f"{url}/admin/v1/tenants", json={"name": "spy"}, headers=H, timeout=30).json()["id"]
    spy = _client(url, _key(url, other)["key"])
    for call in (
        lambda: spy.responses.retrieve(r.id),
        lambda: spy.responses.input_items.list(r.id),
        lambda: spy.responses.delete(r.id),
        lambda: spy.responses.create(model=base, input="x", previous_response_id=r.id, max_output_tokens=1),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert client.responses.retrieve(r.id).id == r.id


def test_a_chain_survives_the_deletion_of_its_link(module_tenant_setup):
    ctx, url, tid, key, _, client = module_tenant_setup
    base = ctx.engine.model_name
    a = client.responses.create(model=base, input="first", max_output_tokens=2)
    b = client.responses.create(model=base, input="second", previous_response_id=a.id, max_output_tokens=2)
    client.responses.delete(a.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=base, input="x", previous_response_id=a.id, max_output_tokens=1)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(a.id)
    # b keeps the conversation it was generated from: it can be read and continued
    assert client.responses.retrieve(b.id).previous_response_id == a.id
    c = client.responses.create(model=base, input="third", previous_response_id=b.id, max_output_tokens=1)
    texts = _texts(client.responses.input_items.list(c.id, order="asc", limit=100))
    assert texts == [
        ("user", "first"),
        ("assistant", a.output_text),
        ("user", "second"),
        ("assistant", b.output_text),
        ("user", "third"),
    ]


def test_hostile_reads_and_metadata_are_4xx(module_tenant_setup):
    ctx, url, tid, key, _, client = module_tenant_setup
    base = ctx.engine.model_name
    r = client.responses.create(model=base, input="hi", max_output_tokens=1)
    h = auth(key)
    for params in ({"after": "x" * 2000}, {"limit": "many"}, {"limit": 10**30}, {"order": ""}):
        got = httpx.get(f"{url}/v1/responses/{r.id}/input_items", params=params, headers=h, timeout=30)
        assert got.status_code in (400, 414), got.text[:200]
    assert httpx.get(f"{url}/v1/responses/{'r' * 4000}", headers=h, timeout=30).status_code == 404
    # a 1 MiB metadata key: refused without being echoed back
    body = {"model": base, "input": "hi", "max_output_tokens": 1, "metadata": {"k" * (1 << 20): "v"}}
    got = httpx.post(f"{url}/v1/responses", json=body, headers=h, timeout=60)
    assert got.status_code == 400 and got.json()["error"]["param"] == "metadata" and len(got.content) < 2048
    raw = b'{"model": "%s", "input": "hi", "metadata": {"k": "\\ud800"}}' % base.encode()
    got = httpx.post(f"{url}/v1/responses", content=raw, headers={**h, "content-type": "application/json"}, timeout=30)
    assert got.status_code == 400, got.text
