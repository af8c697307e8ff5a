"""The fault scenarios of ``benchmarks/scale_out/bench.py --scenario faults`` and ``kill``: the control
plane killed under load (a probe per tenant and the new instance's own timeline), a rolling
restart (SIGHUP) and a SIGTERM drain, each against a real ``loraplex serve --replicas N`` with
closed-loop clients whose tokens are counted from the logprobs and checked against the ledger."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import threading
import time
from pathlib import Path

import httpx

from benchmarks.scale_out.scenarios import H_KEY


async def counted_stream(
    c: httpx.AsyncClient, body: dict, first: list[float] | None = None, headers: dict | None = None
) -> tuple[int, str, int, str]:
    """(status, request id, tokens received, replica) of one streamed completion; the tokens are
    counted one by one from the per-token logprobs (not taken from the usage field). A stream that
    ends in an error event has status 599. ``first`` gets the perf_counter of the first token."""
    body = {**body, "logprobs": 1, "stream": True}
    rid, received, status = "", 0, 200
    async with c.stream("POST", "/v1/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, "", 0, ""
        replica = r.headers.get("x-loraplex-replica", "")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                status = 599
                continue
            rid = ev["id"].removeprefix("cmpl-")
            for ch in ev.get("choices", []):
                received += len((ch.get("logprobs") or {}).get("tokens") or [])
            if first is not None and received and not first:
                first.append(time.perf_counter())
    return status, rid, received, replica


def _billed(db_path: Path, tenant_id: str) -> dict[str, tuple[str, int]]:
    db = sqlite3.connect(db_path)
    try:
        rows = db.execute(
            "SELECT request_id, status, completion_tokens FROM usage_records WHERE tenant_id = ?", (tenant_id,)
        )
        return {rid: (status, int(tokens)) for rid, status, tokens in rows}
    finally:
        db.close()


def _usage_check(db_path: Path, tenant_id: str, answered: list[tuple[int, str, int, str]]) -> dict:
    """Every request its client saw admitted against the ledger: rows missing, rows not equal to
    what the client received, tokens delivered and billed."""
    time.sleep(2.0)  # the last rows leave the ingress's ledger writer
    rows = _billed(db_path, tenant_id)
    seen = [a for a in answered if a[1]]
    mine = {a[1] for a in seen} & rows.keys()  # this run's rows (a tenant may be reused across runs)
    return {
        "requests_with_id": len(seen),
        "rows": len(mine),
        "rows_missing": sum(1 for a in seen if a[1] not in rows),
        "rows_not_equal_received": sum(1 for a in seen if a[1] in rows and rows[a[1]][1] != a[2]),
        "tokens_received": sum(a[2] for a in seen),
        "tokens_billed": sum(rows[rid][1] for rid in mine),
    }


def kill_control(server, tenants: dict[str, tuple[str, str]], clients: int, max_tokens: int, cap_s: float) -> dict:
    """SIGKILL the control-plane actor while ``clients`` closed-loop streams run, spread over
    ``tenants`` (label -> (tenant id, key); a tenant with a limit waits for the actor, one without
    does not). Per tenant: seconds from the kill to the first token and to the first completion of
    a request SENT after the kill, the statuses seen, and the ledger against what every client
    received (usage lost = 0). Bounded: it stops 5 s after every tenant is back, or after ``cap_s``.

    Also per tenant: a probe (one 1-token stream at a time, the next 0.25 s after a failure) sent
    right after the kill: seconds to its first token, i.e. how long a request made at the moment of
    the kill waits. And the new instance's own times (``/admin/v1/engine`` → control): its start
    and when it admitted limited holds again, in seconds after the kill."""
    pid = int(httpx.get(server.url + "/admin/v1/engine", headers=server.headers, timeout=60).json()["control"]["pid"])
    labels = list(tenants)
    killed = threading.Event()
    t_kill = [0.0]
    back: dict[str, float] = {}  # label -> first completion after the kill
    first_token: dict[str, float] = {}  # label -> earliest first token of a request sent after it
    probe_token: dict[str, float] = {}  # label -> first token of the probe sent at the kill
    t_kill_wall = [0.0]
    answered: dict[str, list[tuple[int, str, int, str]]] = {label: [] for label in labels}
    stop = [False]

    async def loop(c: httpx.AsyncClient, i: int) -> None:
        label = labels[i % len(labels)]
        headers = {H_KEY: f"Bearer {tenants[label][1]}"}
        n = 0
        while not stop[0]:
            n += 1
            sent = time.perf_counter()
            body = {"model": "demo", "prompt": f"k {i} {n}", "max_tokens": max_tokens, "ignore_eos": True}
            first: list[float] = []
            res = await counted_stream(c, body, first, headers)
            answered[label].append(res)
            if killed.is_set() and sent >= t_kill[0] and res[0] == 200:
                if first:
                    first_token[label] = min(first_token.get(label, 1e9), first[0] - t_kill[0])
                back.setdefault(label, time.perf_counter() - t_kill[0])
            if (
                killed.is_set()
                and len(back) == len(labels)
                and time.perf_counter() - t_kill[0] > max(back.values()) + 5
            ):
                stop[0] = True

    async def probe(c: httpx.AsyncClient, label: str) -> None:
        await asyncio.wait_for(asyncio.to_thread(killed.wait), timeout=None)
        headers = {H_KEY: f"Bearer {tenants[label][1]}"}
        n = 0
        while not stop[0] and label not in probe_token:
            n += 1
            first: list[float] = []
            body = {"model": "demo", "prompt": f"probe {n}", "max_tokens": 1}
            res = await counted_stream(c, body, first, headers)
            answered[label].append(res)
            if res[0] == 200 and first:
                probe_token[label] = first[0] - t_kill[0]
            else:
                await asyncio.sleep(0.25)

    async def killer() -> None:
        while sum(map(len, answered.values())) < clients:  # every client has finished one request
            await asyncio.sleep(0.2)
        t_kill[0] = time.perf_counter()
        t_kill_wall[0] = time.time()
        os.kill(pid, signal.SIGKILL)
        killed.set()
        await asyncio.sleep(cap_s)
        stop[0] = True

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as c:
            k = asyncio.create_task(killer())
            probes = [probe(c, label) for label in labels]
            await asyncio.gather(*[loop(c, i) for i in range(clients)], *probes)
            k.cancel()

    asyncio.run(run())
    control = httpx.get(server.url + "/admin/v1/engine", headers=server.headers, timeout=60).json()["control"]
    since = {k: (control[k] - t_kill_wall[0]) if control.get(k) else None for k in ("started_at", "admitting_at")}
    out: dict[str, object] = {
        "control_restarted": control.get("pid") not in (None, pid),
        "new_instance_started_after_kill_s": since["started_at"],
        "limited_holds_admitted_again_after_kill_s": since["admitting_at"],
    }
    for label in labels:
        codes: dict[int, int] = {}
        for a in answered[label]:
            codes[a[0]] = codes.get(a[0], 0) + 1
        out[label] = {
            "probe_first_token_after_kill_s": probe_token.get(label),
            "first_token_after_kill_s": first_token.get(label),
            "first_completed_after_kill_s": back.get(label),
            "status_counts": codes,
            "errors": sum(n for code, n in codes.items() if code != 200),
            **_usage_check(server.db_path, tenants[label][0], answered[label]),
        }
    return out


def rolling_restart(server, key: str, tenant_id: str, clients: int, max_tokens: int, cap_s: float) -> dict:
    """SIGHUP to the driver while ``clients`` closed-loop streams run: seconds until the driver
    reports the rollout complete, streams cut, replicas seen before/after, ledger vs received."""
    log_from = len(server.output())
    answered: list[tuple[int, str, int, str]] = []
    t0 = [0.0]
    done_s: list[float | None] = [None]
    stop = [False]

    async def loop(c: httpx.AsyncClient, i: int) -> None:
        n = 0
        while not stop[0]:
            n += 1
            body = {"model": "demo", "prompt": f"r {i} {n}", "max_tokens": max_tokens, "ignore_eos": True}
            answered.append(await counted_stream(c, body))

    async def operator() -> None:
        while len(answered) < clients:
            await asyncio.sleep(0.2)
        t0[0] = time.perf_counter()
        server.proc.send_signal(signal.SIGHUP)
        while time.perf_counter() - t0[0] < cap_s:
            if "rolling restart 1 complete" in server.output()[log_from:]:
                done_s[0] = time.perf_counter() - t0[0]
                break
            await asyncio.sleep(1.0)
        await asyncio.sleep(5)  # a few requests on the new replicas
        stop[0] = True

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, headers={H_KEY: f"Bearer {key}"}, timeout=600) as c:
            await asyncio.gather(operator(), *[loop(c, i) for i in range(clients)])

    before = {r["replica"] for r in server.replicas()}
    asyncio.run(run())
    after = {r["replica"] for r in server.replicas()}
    drained = [int(m) for m in re.findall(r"to shut down: (\d+) ongoing requests", server.output()[log_from:])]
    return {
        "complete_after_s": done_s[0],
        "requests": len(answered),
        "cut_or_failed": sum(1 for a in answered if a[0] != 200 or a[2] != max_tokens),
        "replicas_before": len(before),
        "replicas_after": len(after),
        "replaced": not (before & after),
        "max_ongoing_while_draining": max(drained, default=0),
        **_usage_check(server.db_path, tenant_id, answered),
    }


def sigterm_drain(server, key: str, tenant_id: str, streams: int, max_tokens: int) -> dict:
    """``streams`` streams in flight, SIGTERM to the driver: streams finished, seconds from the
    signal to the driver's "drained" line and to its exit, billed vs received."""
    results: list[tuple[int, str, int, str]] = []
    t0 = [0.0]
    drained_s: list[float | None] = [None]
    log_from = len(server.output())

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, headers={H_KEY: f"Bearer {key}"}, timeout=600) as c:
            body = {"model": "demo", "max_tokens": max_tokens, "ignore_eos": True}
            tasks = [asyncio.create_task(counted_stream(c, {**body, "prompt": f"d {i}"})) for i in range(streams)]
            deadline = time.perf_counter() + 300  # every stream admitted and checkpointed (running rows)
            while time.perf_counter() < deadline:
                rows = await asyncio.to_thread(_billed, server.db_path, tenant_id)
                if sum(1 for st, t in rows.values() if st == "running" and t > 0) >= streams:
                    break
                await asyncio.sleep(0.5)
            t0[0] = time.perf_counter()
            server.proc.send_signal(signal.SIGTERM)

            async def watch() -> None:
                while drained_s[0] is None and time.perf_counter() - t0[0] < 900:
                    if "loraplex: drained" in server.output()[log_from:]:
                        drained_s[0] = time.perf_counter() - t0[0]
                    await asyncio.sleep(0.2)

            w = asyncio.create_task(watch())
            results.extend(await asyncio.gather(*tasks))
            await w

    asyncio.run(run())
    rc = server.proc.wait(900)
    exit_s = time.perf_counter() - t0[0]
    rows = _billed(server.db_path, tenant_id)
    return {
        "exit_code": rc,
        "drained_after_sigterm_s": drained_s[0],
        "exit_after_sigterm_s": exit_s,
        "streams_completed": sum(1 for r in results if r[0] == 200 and r[2] == max_tokens),
        "streams": len(results),
        "tokens_received": sum(r[2] for r in results),
        "tokens_billed": sum(t for _s, t in rows.values()),
        "rows_ok": sum(1 for s, _t in rows.values() if s == "ok"),
    }
