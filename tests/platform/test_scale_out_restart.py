"""Operations on a live ``loraplex serve --replicas 2`` (a real local Ray, SQLite), hit by the
official ``openai`` client:

- a rolling restart of the engine replicas (SIGHUP to the driver) under a mixed load: long
  streams in flight on both replicas when it starts, and, until it is complete, n=2 streams, an
  adapter, a forced tool call, a json_schema stream, a client that disconnects mid-stream, and a
  burst at a tenant's rpm limit. Nothing is cut or refused, every request has exactly one usage row
  billing what its client received (tokens counted from the per-token logprobs, an oracle
  independent of the usage field), Serve's own log shows old replicas draining streams, and
  afterwards two new replicas serve.
- ``kill -9`` of the driver mid-stream (its Ray goes with it, as on a node crash), then a new start
  on the same database: the dead ingress's running rows are closed as ``interrupted``, billed up to
  their last checkpoint and never more than was received, and nothing is counted twice.

The module has its own cluster (one Ray cluster at a time: the ``ray`` xdist group)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest
from billing_helpers import auth, new_adapter, new_tenant, usage_rows
from harness.ray import ServeCluster
from platform_helpers import ADMIN_KEY, adapter_files, make_peft_adapter

pytest.importorskip("ray.serve", reason="the scale-out tests need loraplex[ray]")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(2400),
    # Opt-in: it passed on a real cluster (once at load ~7, once beside two CPU burners) but not yet
    # often enough, and it adds ~7 minutes to the Ray worker of a CI run. Run it with
    # LORAPLEX_TEST_SCALE_OUT_RESTART=1 (beside two CPU burners, CONTRIBUTING.md).
    pytest.mark.skipif(
        os.environ.get("LORAPLEX_TEST_SCALE_OUT_RESTART") != "1",
        reason="opt-in (about 7 minutes of a Ray cluster): set LORAPLEX_TEST_SCALE_OUT_RESTART=1 to run",
    ),
]

WAIT_S = 180  # a bound on one wait, never a measurement
ROLLOUT_S = 1200  # two replica starts and two drains, beside two CPU burners
LONG = 1500  # tokens of a long stream: prompt + this within the demo model's context (2,500 was a 400)

CONFIG = """
[engine]
kv_cache_memory_gb = 0.06
max_num_seqs = 16
max_loras = 2
max_cpu_loras = 4
max_lora_rank = 16
[ledger]
checkpoint_interval_s = 0.3
[cluster]
replicas = 2
ingress_replicas = 1
replica_num_cpus = 0.5
ingress_num_cpus = 0.25
sync_interval_s = 0.5
chunk_timeout_s = 60
drain_timeout_s = 600
"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def clusters(demo_model_dir, tmp_path_factory):
    """The clusters this module started (the kill -9 test starts a second one on the same data)."""
    root = tmp_path_factory.mktemp("restart")
    started = [ServeCluster(root, demo_model_dir, CONFIG, admin_key=ADMIN_KEY)]
    yield started
    for c in started:
        c.stop()


@dataclass
class Seen:
    """What one client received."""

    kind: str
    request_id: str = ""
    replica: str = ""
    status: int = 0
    tokens: int = 0  # counted one by one from the per-token logprobs (every choice)
    usage: int | None = None  # completion_tokens the server reported
    finish: list = field(default_factory=list)  # finish_reason per choice
    error: str = ""
    done: bool = False
    started_before_sighup: bool = False


def _client(url: str, key: str):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=WAIT_S * 2)


def _completion_stream(
    url: str, key: str, seen: Seen, model: str, prompt: str, max_tokens: int, n: int = 1, on_token=None
) -> None:
    """A streamed completion through the openai SDK; ``on_token(seen)`` after each chunk (a
    disconnecting client raises from it to leave)."""
    import openai

    try:
        with _client(url, key).completions.with_streaming_response.create(
            model=model,
            prompt=prompt,
            max_tokens=max_tokens,
            n=n,
            temperature=1.0 if n > 1 else 0.0,
            logprobs=1,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        ) as resp:
            seen.status, seen.replica = resp.http_response.status_code, resp.headers.get("x-loraplex-replica", "")
            for chunk in resp.parse():
                seen.request_id = chunk.id.removeprefix("cmpl-")
                if chunk.usage is not None:
                    seen.usage = chunk.usage.completion_tokens
                for ch in chunk.choices:
                    seen.tokens += len((ch.logprobs and ch.logprobs.tokens) or [])
                    if ch.finish_reason:
                        seen.finish.append(ch.finish_reason)
                if on_token is not None:
                    on_token(seen)
            seen.done = True
    except _Leave:
        pass
    except openai.APIStatusError as exc:
        seen.status, seen.error = exc.status_code, str(exc)[:300]
    except Exception as exc:  # noqa: BLE001 - any other failure is what the test reports
        seen.error = f"{type(exc).__name__}: {str(exc)[:300]}"


def _chat(url: str, key: str, seen: Seen, model: str, **body) -> None:
    """A chat completion (streamed when ``stream``), tokens counted from the logprobs."""
    import openai

    stream = body.pop("stream", False)
    client = _client(url, key)
    try:
        if stream:
            with client.chat.completions.with_streaming_response.create(
                model=model, stream=True, logprobs=True, stream_options={"include_usage": True}, **body
            ) as resp:
                seen.status, seen.replica = resp.http_response.status_code, resp.headers.get("x-loraplex-replica", "")
                for chunk in resp.parse():
                    seen.request_id = chunk.id.removeprefix("chatcmpl-")
                    if chunk.usage is not None:
                        seen.usage = chunk.usage.completion_tokens
                    for ch in chunk.choices:
                        seen.tokens += len((ch.logprobs and ch.logprobs.content) or [])
                        if ch.finish_reason:
                            seen.finish.append(ch.finish_reason)
                seen.done = True
            return
        raw = client.chat.completions.with_raw_response.create(model=model, **body)
        out = raw.parse()
        seen.status, seen.replica = raw.http_response.status_code, raw.headers.get("x-loraplex-replica", "")
        seen.request_id = out.id.removeprefix("chatcmpl-")
        seen.usage = seen.tokens = out.usage.completion_tokens  # a whole answer: what it says is what it got
        seen.finish = [c.finish_reason for c in out.choices]
        seen.done = bool(out.choices[0].message.tool_calls) or seen.kind != "tools"
    except openai.APIStatusError as exc:
        seen.status, seen.error = exc.status_code, str(exc)[:300]
    except Exception as exc:  # noqa: BLE001 - reported by the test
        seen.error = f"{type(exc).__name__}: {str(exc)[:300]}"


class _Leave(Exception):
    """A client that walks away mid-stream."""


def _rpm_burst(url: str, key: str, n: int) -> list[tuple[int, str]]:
    """n simultaneous small requests: (status, request id or error code)."""

    async def one(c: httpx.AsyncClient) -> tuple[int, str]:
        r = await c.post("/v1/completions", json={"model": "demo", "prompt": "rpm", "max_tokens": 3})
        body = r.json()
        return r.status_code, body["id"].removeprefix("cmpl-") if r.status_code == 200 else body["error"]["code"]

    async def burst() -> list[tuple[int, str]]:
        async with httpx.AsyncClient(base_url=url, headers=auth(key), timeout=WAIT_S) as c:
            return list(await asyncio.gather(*[one(c) for _ in range(n)]))

    return asyncio.run(burst())


def _db_rows(cluster: ServeCluster, tenant_id: str) -> list[tuple[str, str, int]]:
    """Every usage row of a tenant straight from the database: (request id, status, completion tokens)."""
    db = sqlite3.connect(cluster.db_path)
    try:
        return list(
            db.execute(
                "SELECT request_id, status, completion_tokens FROM usage_records WHERE tenant_id = ?", (tenant_id,)
            )
        )
    finally:
        db.close()


def _draining_lines(output: str) -> list[int]:
    """Serve's own log of a replica being stopped: 'Waiting for an additional 1.0s to shut down:
    N ongoing requests' (printed by a replica Serve drains; N > 0 means streams were in flight)."""
    return [int(m) for m in re.findall(r"to shut down: (\d+) ongoing requests", output)]


def test_rolling_restart_cuts_nothing_under_a_mixed_load(clusters, demo_model_dir, tmp_path):
    cluster = clusters[0]
    tid, key = new_tenant(cluster.url, "rolling")
    rpm_tid, rpm_key = new_tenant(cluster.url, "rolling-rpm", quota={"rpm": 5})
    files = adapter_files(make_peft_adapter(demo_model_dir, tmp_path / "roll-adapter", seed=7))
    new_adapter(cluster.url, "roll-adapter", tid, files)
    old = {r["replica"]: int(r["pid"]) for r in cluster.replicas()}
    assert len(old) == 2, old
    log_before = len(cluster.output())

    seen: list[Seen] = []
    threads: list[threading.Thread] = []
    lock = threading.Lock()

    def launch(target, s: Seen, *args, **kwargs) -> threading.Thread:
        with lock:
            seen.append(s)
        t = threading.Thread(target=target, args=(cluster.url, key, s, *args), kwargs=kwargs, daemon=True)
        threads.append(t)
        t.start()
        return t

    # long streams, on both replicas, in flight when the restart begins
    longs: list[Seen] = []
    for i in range(8):
        s = Seen("long", started_before_sighup=True)
        longs.append(s)
        launch(_completion_stream, s, "demo", f"Long story {i}", LONG)
        if i >= 3:
            deadline = time.monotonic() + WAIT_S
            while not all(x.tokens or x.error for x in longs):
                assert time.monotonic() < deadline, "the long streams did not start"
                time.sleep(0.2)
            if len({x.replica for x in longs if not x.done}) == 2:
                break
    assert len({x.replica for x in longs if not x.done}) == 2, [(x.replica, x.tokens, x.status, x.error) for x in longs]
    cluster.proc.send_signal(signal.SIGHUP)

    # until the rollout is complete: new requests of every kind, one wave at a time
    complete = re.compile(r"rolling restart 1 complete")
    rpm_results: list[tuple[int, str]] = []
    deadline = time.monotonic() + ROLLOUT_S
    waves = 0
    while True:
        finished = bool(complete.search(cluster.output()[log_before:]))
        wave = [
            Seen("n2"),
            Seen("adapter"),
            Seen("tools"),
            Seen("schema"),
            Seen("leave"),
            Seen("base"),
        ]
        launch(_completion_stream, wave[0], "demo", f"Two tales {waves}", 120, n=2)
        launch(_completion_stream, wave[1], "roll-adapter", f"Adapter tale {waves}", 80)
        launch(
            _chat,
            wave[2],
            "demo",
            messages=[{"role": "user", "content": f"Weather in Paris? ({waves})"}],
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=60,
        )
        launch(
            _chat,
            wave[3],
            "demo",
            stream=True,
            messages=[{"role": "user", "content": f"A person as JSON ({waves})"}],
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}},
            max_tokens=80,
        )

        def leave_after_five(s: Seen) -> None:
            if s.tokens >= 5:
                raise _Leave

        launch(_completion_stream, wave[4], "demo", f"Walk away {waves}", 400, on_token=leave_after_five)
        launch(_completion_stream, wave[5], "demo", f"Short {waves}", 40)
        if waves == 1:  # a tenant at its rpm limit while the first old replica drains
            rpm_results = _rpm_burst(cluster.url, rpm_key, 12)
        for t in threads[-len(wave) :]:  # this wave's requests
            t.join(2 * WAIT_S)
        waves += 1
        if finished and waves >= 3:
            break
        assert time.monotonic() < deadline, f"the rollout did not complete: {cluster.output()[-3000:]}"
    for t in threads:
        t.join(3 * WAIT_S)
    assert not any(t.is_alive() for t in threads), "a request hung"
    output = cluster.output()[log_before:]
    print(f"rolling restart: {waves} waves, {len(seen)} requests, drain log lines {_draining_lines(output)}")

    # nothing cut, nothing refused (but the rpm burst's extra requests)
    for s in seen:
        assert s.status == 200 and not s.error, s
        if s.kind == "leave":
            assert s.tokens >= 5 and not s.done, s
            continue
        assert s.done and s.usage is not None, s
        assert s.tokens == s.usage, s  # the client was told of every token it received
        expected = {"n2": 2}.get(s.kind, 1)
        assert len(s.finish) == expected and set(s.finish) <= {"length", "stop", "tool_calls"}, s
    for s in longs:
        assert s.tokens == LONG and s.finish == ["length"], s
    codes = [c for c, _ in rpm_results]
    assert codes.count(200) == 5 and codes.count(429) == 7, rpm_results

    # billing: exactly one row per request, equal to what its client received
    deadline = time.monotonic() + WAIT_S  # the client that left: closed once the server noticed
    while True:
        rows = _db_rows(cluster, tid)
        running = [r for r in rows if r[1] == "running"]
        if not running:
            break
        assert time.monotonic() < deadline, running
        time.sleep(0.5)
    ids = [rid for rid, _, _ in rows]
    assert len(ids) == len(set(ids)) == len(seen), (len(ids), len(set(ids)), len(seen))
    by_id = {rid: (status, tokens) for rid, status, tokens in rows}
    for s in seen:
        status, tokens = by_id[s.request_id]
        if s.kind == "leave":  # billed as generated until the abort reached the engine
            assert status == "aborted" and tokens >= s.tokens, (s, status, tokens)
        else:
            assert (status, tokens) == ("ok", s.tokens), (s, status, tokens)
    rpm_rows = _db_rows(cluster, rpm_tid)
    assert sorted(r for r, _, _ in rpm_rows) == sorted(rid for c, rid in rpm_results if c == 200)
    assert {status for _, status, _ in rpm_rows} == {"ok"}

    # old replicas drained streams before they stopped (Serve's own log), and both were replaced
    assert any(n > 0 for n in _draining_lines(output)), "no replica was stopped with a stream in flight"
    deadline = time.monotonic() + WAIT_S
    while True:
        now = {r["replica"]: int(r["pid"]) for r in cluster.replicas()}
        if len(now) == 2 and not set(now) & set(old):
            break
        assert time.monotonic() < deadline, f"the replicas were not all replaced: {old} -> {now}"
        time.sleep(1.0)
    for pid in old.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    after: set[str] = set()
    deadline = time.monotonic() + WAIT_S
    while len(after) < 2:  # both new replicas serve (concurrent streams spread over them)
        assert time.monotonic() < deadline, after
        wave = [Seen("after") for _ in range(8)]
        ts = [
            threading.Thread(target=_completion_stream, args=(cluster.url, key, s, "demo", "after", 60), daemon=True)
            for s in wave
        ]
        for t in ts:
            t.start()
        for t in ts:
            t.join(2 * WAIT_S)
        assert all(s.status == 200 and s.done for s in wave), wave
        after |= {s.replica for s in wave}
    assert after == set(now), (after, now)


def _checkpointed(cluster: ServeCluster, tid: str, streams: list[Seen]) -> bool:
    rows = usage_rows(cluster.url, tid)
    return all(
        s.request_id in rows
        and rows[s.request_id]["status"] == "running"
        and rows[s.request_id]["completion_tokens"] > 0
        for s in streams
    )


def test_driver_kill9_mid_stream_then_restart_closes_the_dead_rows_once(clusters, demo_model_dir):
    """kill -9 of the driver (its local Ray, the ingress and the engine replicas go down with it),
    a new start on the same database: the cut streams' rows are closed as interrupted and billed at
    their last checkpoint (never more than received), the finished ones stay as they were, and no
    request has two rows."""
    cluster = clusters[0]
    tid, key = new_tenant(cluster.url, "crash")
    done = [Seen("short") for _ in range(3)]
    for s in done:
        _completion_stream(cluster.url, key, s, "demo", "before the crash", 30)
        assert s.status == 200 and s.done, s
    cut = [Seen("long") for _ in range(4)]
    threads = [
        threading.Thread(
            target=_completion_stream, args=(cluster.url, key, s, "demo", f"Cut story {i}", LONG), daemon=True
        )
        for i, s in enumerate(cut)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + WAIT_S
    while not all(s.request_id for s in cut) or not _checkpointed(cluster, tid, cut):
        assert time.monotonic() < deadline, f"no checkpoint of every stream: {cut}"
        time.sleep(0.3)
    os.kill(cluster.proc.pid, signal.SIGKILL)  # the driver only: Ray's processes share its fate
    for t in threads:
        t.join(2 * WAIT_S)
    assert not any(t.is_alive() for t in threads), "a stream outlived its server"
    assert all(s.error and not s.done for s in cut), cut
    received = {s.request_id: s.tokens for s in cut}
    cluster.stop(timeout=5)  # whatever of the dead run's process group is left (a crashed node)

    again = ServeCluster(cluster.root, demo_model_dir, CONFIG, admin_key=ADMIN_KEY)
    clusters.append(again)
    rows = _db_rows(again, tid)
    ids = [rid for rid, _, _ in rows]
    assert len(ids) == len(set(ids)) == len(done) + len(cut), rows
    by_id = {rid: (status, tokens) for rid, status, tokens in rows}
    for s in done:
        assert by_id[s.request_id] == ("ok", s.tokens), (s, by_id[s.request_id])
    for s in cut:
        status, tokens = by_id[s.request_id]
        assert status == "interrupted", (s, status, tokens)
        assert 0 < tokens <= received[s.request_id], (s, tokens)
    # the restarted service bills new requests once, beside the closed ones
    s = Seen("after")
    _completion_stream(again.url, key, s, "demo", "after the crash", 20)
    assert s.status == 200 and s.done and s.tokens == 20, s
    rows = _db_rows(again, tid)
    assert len(rows) == len(done) + len(cut) + 1
    assert dict((r, (st, t)) for r, st, t in rows)[s.request_id] == ("ok", 20)
    assert {st for rid, st, _ in rows if rid in received} == {"interrupted"}
    print(
        f"driver kill -9: cut streams received {sorted(received.values())}, billed {sorted(by_id[r][1] for r in received)}"
    )
