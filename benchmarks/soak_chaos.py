"""Chaos soak (the companion of soak.py): mixed request kinds against real ``loraplex serve``
processes on one PostgreSQL database while faults happen, then a per-request reconciliation.

    .venv/bin/python benchmarks/soak_chaos.py --seconds 60 --clients 8      # needs root (private PG)

Request kinds (round robin per client): streaming, non-streaming, n=3, a prompt list, chat with
tools, chat with a json_schema, a client that disconnects mid-answer, hostile strings (a lone
surrogate in ``user``: must be a 400). One tenant of each client pair has a token budget (per day,
so it survives restarts: the ledger is its memory).

Faults, in order over the run: ``kill -9`` of server A (restarted on its data dir), server B
started on the same database (side by side: clients alternate), PostgreSQL stopped for a few
seconds, SIGTERM of A (a rolling restart: B serves on).

Reconciliation, from the final export of the usage ledger:
- records lost: a complete response with no ``ok`` record or other token counts than the client got
- billed != delivered: complete responses whose record bills other completion tokens
- hung: requests that never answered within the client timeout
- slots leaked: ``running`` in each tenant's quota consumption once everything ended
- budget overshoot: billed tokens of the budget tenant over its budget (% of the budget)
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import H, Postgres, Server, _free_port
from workload import print_table, write_json

KINDS = ("stream", "plain", "n3", "list", "tools", "json", "leave", "hostile")
TOOLS = [{"type": "function", "function": {"name": "get", "parameters": {"type": "object", "properties": {}}}}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@dataclass
class Outcome:
    kind: str
    tenant: int
    status: int = 0
    request_id: str | None = None
    completion: int | None = None  # what the client was told it received (complete responses)
    complete: bool = False
    hung: bool = False


@dataclass
class Chaos:
    urls: list[str]
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)


def _body(kind: str, model: str, max_tokens: int) -> tuple[str, dict | bytes]:
    chat = {"model": model, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": max_tokens}
    comp = {"model": model, "prompt": "Once upon a time", "max_tokens": max_tokens}
    if kind == "stream":
        return "/v1/completions", {**comp, "stream": True, "stream_options": {"include_usage": True}}
    if kind == "n3":
        return "/v1/completions", {**comp, "n": 3}
    if kind == "list":
        return "/v1/completions", {**comp, "prompt": ["One", "Two two"]}
    if kind == "tools":
        return "/v1/chat/completions", {**chat, "tools": TOOLS}
    if kind == "json":
        schema = {"name": "a", "schema": SCHEMA}
        return "/v1/chat/completions", {**chat, "response_format": {"type": "json_schema", "json_schema": schema}}
    if kind == "hostile":
        return "/v1/completions", json.dumps({**comp, "user": "\ud800"}).encode()
    return "/v1/completions", {**comp, "max_tokens": max_tokens * (8 if kind == "leave" else 1)}


def one(chaos: Chaos, url: str, key: str, model: str, kind: str, tenant: int, max_tokens: int) -> Outcome:
    out = Outcome(kind, tenant)
    path, body = _body(kind, model, max_tokens)
    headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    timeout = httpx.Timeout(3 if kind == "leave" else 120, connect=3)
    try:
        with httpx.Client(timeout=timeout) as c:
            if kind == "stream":
                with c.stream("POST", url + path, content=content, headers=headers) as r:
                    out.status = r.status_code
                    for line in r.iter_lines():
                        if line == "data: [DONE]":
                            out.complete = out.completion is not None
                        elif line.startswith("data: {"):
                            ev = json.loads(line[6:])
                            out.request_id = ev.get("id", "").removeprefix("cmpl-") or out.request_id
                            if ev.get("usage"):
                                out.completion = ev["usage"]["completion_tokens"]
                return out
            r = c.post(url + path, content=content, headers=headers)
            out.status = r.status_code
            if r.status_code == 200:
                data = r.json()
                out.request_id = data["id"].split("-", 1)[1]
                out.completion = data["usage"]["completion_tokens"]
                out.complete = kind != "list"  # a list's other prompts have ids the client never sees
    except httpx.ReadTimeout:
        out.hung = kind != "leave"  # the leaver gives up on purpose
    except (httpx.HTTPError, json.JSONDecodeError):
        out.status = out.status or -1  # the server died under it (kill -9): cut, not hung
    return out


def client(chaos: Chaos, i: int, keys: list[str], model: str, max_tokens: int) -> None:
    for n in itertools.count():
        if chaos.stop.is_set():
            return
        kind = KINDS[(i + n) % len(KINDS)]
        tenant = (i + n) % len(keys)
        url = chaos.urls[n % len(chaos.urls)]
        o = one(chaos, url, keys[tenant], model, kind, tenant, max_tokens)
        with chaos.lock:
            chaos.outcomes.append(o)
        if o.status in (-1, 429, 503):
            time.sleep(0.3)


def run(args) -> dict:
    from loraplex.engine.demo_model import ensure_demo_model

    model = Path(ensure_demo_model(Path(tempfile.gettempdir()) / "loraplex-soak-model"))
    root = Path(tempfile.mkdtemp(prefix="soak-chaos-"))
    pg = Postgres()
    env = {
        "LORAPLEX_DATABASE_URL": pg.url,
        "LORAPLEX_ENGINE__MAX_NUM_SEQS": "16",
        "LORAPLEX_AUTH__KEY_CACHE_TTL_S": "60",
        "LORAPLEX_LEDGER__CHECKPOINT_INTERVAL_S": "0.5",
        "LORAPLEX_SECRET_KEY": "soak-chaos-shared-secret-0123456789",  # servers on one DB share it
    }
    (root / "a").mkdir()
    (root / "b").mkdir()
    port_a = _free_port()
    a = Server(root / "a" / "data", model, env, port_a, start_timeout=400)
    b: Server | None = None
    faults: list[str] = []
    budget = args.budget
    try:
        keys, tids = [], []
        for t in range(2):
            tid = httpx.post(a.url + "/admin/v1/tenants", json={"name": f"t{t}"}, headers=H).json()["id"]
            keys.append(httpx.post(a.url + f"/admin/v1/tenants/{tid}/keys", json={}, headers=H).json()["key"])
            tids.append(tid)
        quota = {"token_budget": budget, "budget_period": "day"}
        httpx.put(a.url + f"/admin/v1/tenants/{tids[1]}/quota", json=quota, headers=H).raise_for_status()
        base = httpx.get(a.url + "/v1/models", headers={"Authorization": f"Bearer {keys[0]}"}).json()["data"][0]["id"]
        chaos = Chaos([a.url])
        threads = [
            threading.Thread(target=client, args=(chaos, i, keys, base, args.max_tokens), daemon=True)
            for i in range(args.clients)
        ]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        plan = [(0.2, "kill -9 A"), (0.35, "start B"), (0.5, "PostgreSQL outage"), (0.7, "SIGTERM A")]
        for at, fault in plan:
            while time.monotonic() - t0 < at * args.seconds:
                time.sleep(0.1)
            if fault == "kill -9 A":
                a.kill()
                a = Server(root / "a" / "data", model, env, port_a, start_timeout=400)
            elif fault == "start B":
                b = Server(root / "b" / "data", model, env, _free_port(), start_timeout=400)
                chaos.urls = [a.url, b.url]
            elif fault == "PostgreSQL outage":
                pg.stop()
                time.sleep(args.outage)
                pg.start()
            elif fault == "SIGTERM A":
                assert b is not None
                chaos.urls = [b.url]
                a.proc.send_signal(signal.SIGTERM)
                a.proc.wait(60)
            faults.append(fault)
        while time.monotonic() - t0 < args.seconds:
            time.sleep(0.1)
        chaos.stop.set()
        for t in threads:
            t.join(180)
        assert b is not None
        deadline = time.time() + 90  # let B's spool drain before reconciling
        while time.time() < deadline and httpx.get(b.url + "/ready").json().get("usage_spool"):
            time.sleep(0.5)
        running = [
            httpx.get(b.url + f"/admin/v1/tenants/{tid}/quota/consumption", headers=H).json()["running"] for tid in tids
        ]
        export = httpx.get(b.url + "/admin/v1/usage/export", params={"format": "jsonl"}, headers=H, timeout=60)
        rows = {r["request_id"]: r for r in map(json.loads, export.text.splitlines())}
    finally:
        for srv in (a, b):
            if srv is not None:
                srv.stop()
        pg.destroy()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}")
    outs = chaos.outcomes
    complete = [o for o in outs if o.complete]
    lost = sum(1 for o in complete if o.request_id not in rows or rows[o.request_id]["status"] != "ok")
    mismatch = sum(
        1 for o in complete if o.request_id in rows and rows[o.request_id]["completion_tokens"] != o.completion
    )
    budget_billed = sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows.values() if r["tenant_id"] == tids[1])
    return {
        "seconds": args.seconds,
        "clients": args.clients,
        "faults": ", ".join(faults),
        "requests": len(outs),
        "by_status": {str(s): sum(o.status == s for o in outs) for s in sorted({o.status for o in outs})},
        "by_kind_complete": {k: sum(o.kind == k for o in complete) for k in KINDS},
        "hostile_not_400": sum(o.kind == "hostile" and o.status > 0 and o.status != 400 for o in outs),
        "complete": len(complete),
        "records_lost": lost,
        "billed_ne_delivered": mismatch,
        "hung": sum(o.hung for o in outs),
        "slots_leaked": sum(running),
        "budget": budget,
        "budget_billed": budget_billed,
        "budget_overshoot_pct": max(0.0, (budget_billed - budget) / budget * 100),
        "records": len(rows),
        "statuses_in_ledger": {
            s: sum(r["status"] == s for r in rows.values()) for s in {r["status"] for r in rows.values()}
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--budget", type=int, default=3000)
    ap.add_argument("--outage", type=float, default=3.0)
    ap.add_argument("--keep", action="store_true", help="keep the data dirs and server logs")
    args = ap.parse_args()
    result = run(args)
    cols = ["requests", "complete", "records_lost", "billed_ne_delivered", "hung", "slots_leaked"]
    cols += ["hostile_not_400", "budget", "budget_billed", "budget_overshoot_pct"]
    print_table([result], cols)
    for k in ("faults", "by_status", "by_kind_complete", "statuses_in_ledger"):
        print(f"{k}: {result[k]}")
    path = write_json("soak_chaos", {"args": vars(args), "result": result})
    print(f"\nwrote {path}")
    bad = result["records_lost"] or result["billed_ne_delivered"] or result["hung"] or result["slots_leaked"]
    return 1 if bad or result["budget_overshoot_pct"] > 1 else 0


if __name__ == "__main__":
    sys.exit(main())
