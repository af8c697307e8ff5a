"""Hostile combinations with faults, on a real ``loraplex serve`` over a PostgreSQL server of the
test's own: each test reproduced a failure a hostile tester found (it failed before its fix)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from billing_helpers import H, auth, new_tenant, usage_rows

# Forces a long answer (600 characters of a string), so the outage lands mid-generation whatever
# the random model would rather write; it ends as valid JSON well before max_output_tokens.
LONG = {
    "type": "json_schema",
    "name": "long",
    "schema": {
        "type": "object",
        "properties": {"a": {"type": "string", "minLength": 600, "maxLength": 600}},
        "required": ["a"],
    },
}


@pytest.mark.slow
def test_a_stored_response_that_finishes_during_a_database_outage_is_still_delivered(
    tmp_path, demo_model_dir, private_postgres, serve_process
):
    """/v1/responses with store=true writes the response after generating it. With PostgreSQL down at
    that moment the stream was dropped before response.completed (and a plain request became a 503),
    although the answer was generated and billed (the ledger spools through the outage)."""
    pg = private_postgres
    server = serve_process(tmp_path / "data", demo_model_dir, env={"LORAPLEX_DATABASE_URL": pg.url})
    _tid, key = new_tenant(server.url, "acme")
    model = httpx.get(server.url + "/v1/models", headers=auth(key)).json()["data"][0]["id"]
    body = {"model": model, "input": "Write.", "max_output_tokens": 1500, "text": {"format": LONG}, "store": True}
    streamed: list[dict] = []
    plain: dict = {}
    first_delta = threading.Event()

    def stream() -> None:
        try:
            with httpx.stream(
                "POST", server.url + "/v1/responses", headers=auth(key), json={**body, "stream": True}, timeout=600
            ) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        event = json.loads(line[6:])
                        streamed.append(event)
                        if event["type"] == "response.output_text.delta":
                            first_delta.set()
        except httpx.HTTPError as exc:
            streamed.append({"type": "dropped", "error": repr(exc)})
        finally:
            first_delta.set()

    def non_streaming() -> None:
        r = httpx.post(server.url + "/v1/responses", headers=auth(key), json=body, timeout=600)
        plain["status"], plain["body"] = r.status_code, r.json()

    threads = [threading.Thread(target=stream), threading.Thread(target=non_streaming)]
    for t in threads:
        t.start()
    assert first_delta.wait(300)
    pg.stop("fast")  # an outage (a fast stop: no crash recovery to wait for at the restart)
    completed_before_outage = any(e["type"] == "response.completed" for e in streamed)
    for t in threads:
        t.join(600)
    pg.start()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        ready = httpx.get(server.url + "/ready", timeout=30).json()
        if ready["status"] == "ready" and not ready["usage_spool"]:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"not ready again after the outage: {ready}")

    assert not completed_before_outage, "the answer ended before the outage: the test did not exercise it"
    types = [e["type"] for e in streamed]
    assert types[-1] == "response.completed", f"the stream ended with {types[-3:]}"
    final = streamed[-1]["response"]
    assert plain["status"] == 200, plain
    rows = usage_rows(server.url)
    for response in (final, plain["body"]):
        assert response["status"] == "completed"
        json.loads(response["output"][0]["content"][0]["text"])  # the whole answer arrived
        # delivered, saying it was not stored (GET agrees), and billed as delivered
        assert response["store"] is False
        got = httpx.get(f"{server.url}/v1/responses/{response['id']}", headers=auth(key), timeout=30)
        assert got.status_code == 404
    billed = sorted(r["completion_tokens"] for r in rows.values() if r["status"] == "ok")
    delivered = sorted(r["usage"]["output_tokens"] for r in (final, plain["body"]))
    assert billed == delivered, (billed, delivered)
    assert httpx.get(server.url + "/admin/v1/usage", headers=H, timeout=30).status_code == 200


@pytest.mark.slow
def test_a_start_against_another_database_leaves_the_adapter_files_alone(
    tmp_path, demo_model_dir, serve_process, good_files
):
    """An operator mistake, one start with the wrong LORAPLEX_DATABASE_URL on the same data dir,
    must not destroy the adapters of the real database."""
    from billing_helpers import new_adapter

    data = tmp_path / "data"
    real = {"LORAPLEX_DATABASE_URL": f"sqlite:///{tmp_path / 'real.db'}"}
    first = serve_process(data, demo_model_dir, env=real)
    tid, _key = new_tenant(first.url, "acme")
    aid = new_adapter(first.url, "bot", tid, good_files)
    first.stop()
    wrong = serve_process(data, demo_model_dir, env={"LORAPLEX_DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}"})
    wrong.stop()
    again = serve_process(data, demo_model_dir, env=real)
    adapter = httpx.get(f"{again.url}/admin/v1/adapters/{aid}", headers=H, timeout=30).json()
    assert adapter["status"] == "active", adapter
    assert "belongs to another database" in wrong.output()  # the wrong start said why it swept nothing
