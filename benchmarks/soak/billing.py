"""Soak test of the billing path: N client streams from several tenants against a real
``loraplex serve`` for T seconds, with optional faults, then a reconciliation of what the clients
received against what the usage ledger billed.

    .venv/bin/python -m benchmarks.soak.billing                          # ledger vs old writer, no faults
    .venv/bin/python -m benchmarks.soak.billing --kill-every 6           # + kill -9 / restart every 6 s
    .venv/bin/python -m benchmarks.soak.billing --db-outage 3            # + PostgreSQL stopped 3 s (root)
    .venv/bin/python -m benchmarks.soak.billing --quick

``benchmarks/soak/chaos.py`` is the chaos companion: mixed request kinds (n > 1, prompt lists,
tools, json_schema, disconnecting clients, hostile strings) with kill -9, a second server on the
same PostgreSQL, a database outage and SIGTERM, reconciled per request.

Configurations (one process runs them in turn, each on a fresh data dir):
  writer    ledger.durable=false: records written in the background, like the old writer
  ledger    ledger.durable=true: the admission and final records are durable before bytes leave
  +kill     ledger with ``kill -9`` of the server every --kill-every seconds, restarted on the same dir
  +outage   ledger on a private PostgreSQL stopped for --db-outage seconds mid-run

"records lost" counts every request whose client saw a complete response without a matching
``ok`` record (or with other token counts), plus every stream that received tokens and has no
record at all. "tokens delivered" = completion tokens of complete responses + content chunks of
cut streams (a lower bound: a chunk is >= 1 token). Latency columns are client-side time to first
token of streams (p50/p99, ms); "admission +ms" is the ledger's p50/p99 minus the writer's.

First, an in-process table measures the durable wait itself (queue → committed), the latency the
ledger adds twice per request, at 1/16/64 concurrent writers (SQLite, and PostgreSQL with
--postgres-url); it is far less noisy than the end-to-end TTFT difference.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.lib.workload import print_table, write_json
from tests.harness.net import free_port
from tests.harness.postgres import PostgresServer
from tests.harness.serve import ServeProcess

ADMIN_KEY = "soak-admin-key-0123456789abcdef"
H = {"Authorization": f"Bearer {ADMIN_KEY}"}


SOAK_CONFIG = "[engine]\nkv_cache_memory_gb = 0.2\n"


def start_server(data: Path, model: Path, env: dict[str, str], port: int, start_timeout: float = 600) -> ServeProcess:
    """``loraplex serve`` of the soak (the harness's process: its log beside ``data``)."""
    return ServeProcess(
        data, model, admin_key=ADMIN_KEY, env=dict(env), port=port, config=SOAK_CONFIG, start_timeout=start_timeout
    )


@dataclass
class Seen:
    request_id: str | None = None
    status: int = 0
    completion: int | None = None
    chunks: int = 0
    ttft_s: float | None = None
    done: bool = False


@dataclass
class Run:
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    base_url: list[str] = field(default_factory=list)  # current server (changes on restart)


def client(run: Run, key: str, model: str, max_tokens: int) -> None:
    body = {
        "model": model,
        "prompt": "Once upon a time",
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    while not run.stop.is_set():
        s = Seen()
        with run.lock:
            run.seen.append(s)
        t0 = time.monotonic()
        try:
            with (
                httpx.Client(timeout=httpx.Timeout(60, connect=2)) as c,
                c.stream(
                    "POST", run.base_url[0] + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
                ) as r,
            ):
                s.status = r.status_code
                if r.status_code != 200:
                    r.read()
                    time.sleep(0.2)
                    continue
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        s.done = s.completion is not None
                        break
                    if not line.startswith("data: "):
                        continue
                    ev = json.loads(line[6:])
                    if "error" in ev:
                        continue
                    s.request_id = ev["id"].removeprefix("cmpl-")
                    if ev.get("usage"):
                        s.completion = ev["usage"]["completion_tokens"]
                    if any(ch.get("text") for ch in ev.get("choices", [])):
                        s.chunks += 1
                        if s.ttft_s is None:
                            s.ttft_s = time.monotonic() - t0
        except (httpx.HTTPError, json.JSONDecodeError):
            time.sleep(0.2)


def soak(name: str, args, model: Path, *, durable: bool, kill_every: float, outage: float) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"soak-{name}-"))
    data = root / "data"
    pg = PostgresServer(database="soak") if outage else None
    env = {
        "LORAPLEX_LEDGER__DURABLE": str(durable).lower(),
        "LORAPLEX_ENGINE__MAX_NUM_SEQS": str(args.max_num_seqs),
        "LORAPLEX_AUTH__KEY_CACHE_TTL_S": "60",
    }
    if pg:
        env["LORAPLEX_DATABASE_URL"] = pg.url
    port = free_port()
    server = start_server(data, model, env, port)
    run = Run(base_url=[server.url])
    restarts, outages = 0, 0
    try:
        keys = []
        for i in range(args.tenants):
            tid = httpx.post(server.url + "/admin/v1/tenants", json={"name": f"t{i}"}, headers=H).json()["id"]
            keys.append(httpx.post(server.url + f"/admin/v1/tenants/{tid}/keys", json={}, headers=H).json()["key"])
        base = httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {keys[0]}"}).json()["data"][0][
            "id"
        ]
        threads = [
            threading.Thread(target=client, args=(run, keys[i % len(keys)], base, args.max_tokens), daemon=True)
            for i in range(args.streams)
        ]
        for t in threads:
            t.start()
        start = time.monotonic()
        next_kill = start + kill_every if kill_every else None
        outage_at = start + args.seconds / 3 if outage else None
        while time.monotonic() - start < args.seconds:
            now = time.monotonic()
            if next_kill and now >= next_kill:
                server.kill()
                server = start_server(data, model, env, port)
                restarts += 1
                next_kill = time.monotonic() + kill_every
            if outage_at and now >= outage_at:
                pg.stop()
                time.sleep(outage)
                pg.start()
                outages += 1
                outage_at = None
            time.sleep(0.1)
        run.stop.set()
        for t in threads:
            t.join(90)
        deadline = time.time() + 60  # let a spool drain before reconciling
        while time.time() < deadline and httpx.get(server.url + "/ready").json().get("usage_spool"):
            time.sleep(0.5)
        export = httpx.get(server.url + "/admin/v1/usage/export", params={"format": "jsonl"}, headers=H, timeout=60)
        rows = {r["request_id"]: r for r in map(json.loads, export.text.splitlines())}
    finally:
        server.stop()
        if pg:
            pg.destroy()
        shutil.rmtree(root, ignore_errors=True)
    sent = [s for s in run.seen if s.status or s.request_id]
    complete = [s for s in sent if s.done]
    cut = [s for s in sent if s.request_id and not s.done and s.chunks]
    lost = sum(
        1
        for s in complete
        if s.request_id not in rows
        or rows[s.request_id]["status"] != "ok"
        or rows[s.request_id]["completion_tokens"] != s.completion
    )
    lost += sum(1 for s in cut if s.request_id not in rows)
    ttfts = sorted(s.ttft_s for s in complete if s.ttft_s is not None)
    ids = {s.request_id for s in sent if s.request_id}
    return {
        "config": name,
        "seconds": args.seconds,
        "streams": args.streams,
        "restarts": restarts,
        "outages": outages,
        "sent": len(run.seen),
        "succeeded": len(complete),
        "failed": len(run.seen) - len(complete),
        "http_503": sum(s.status == 503 for s in run.seen),
        "cut_streams": len(cut),
        "tokens_delivered": sum(s.completion for s in complete) + sum(s.chunks for s in cut),
        "tokens_billed": sum(r["completion_tokens"] for rid, r in rows.items() if rid in ids),
        "records": len(rows),
        "records_lost": lost,
        "ttft_p50_ms": _pct(ttfts, 50) * 1000,
        "ttft_p99_ms": _pct(ttfts, 99) * 1000,
    }


def ledger_latency(name: str, url: str, concurrency: int, per_thread: int) -> dict:
    """What durability adds to a request: the time from queuing a record to it being durable (the
    wait at admission and again before the final chunk), with ``concurrency`` requests writing at
    once through one group-committing ledger. The old writer's wait was 0 by construction."""
    from loraplex.platform.db import migrate
    from loraplex.platform.db.session import make_db_engine, make_session_factory
    from loraplex.platform.usage.ledger import UsageLedger

    migrate.upgrade(url)
    engine = make_db_engine(url)
    spool = Path(tempfile.mkdtemp(prefix="soak-spool-"))
    ledger = UsageLedger(make_session_factory(engine), spool).start()
    waits: list[float] = []
    lock = threading.Lock()

    def worker(w: int) -> None:
        mine = []
        for i in range(per_thread):
            rid = f"bench-{w}-{i}-{time.time_ns()}"
            for status in ("running", "ok"):
                t0 = time.perf_counter()
                ledger.write(
                    request_id=rid,
                    tenant_id="ten_bench",
                    api_key_id=None,
                    adapter_id=None,
                    adapter_name=None,
                    endpoint="completions",
                    prompt_tokens=12,
                    completion_tokens=48,
                    ttft_ms=None,
                    latency_ms=None,
                    status=status,
                ).result(60)
                mine.append(time.perf_counter() - t0)
        with lock:
            waits.extend(mine)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    stats = ledger.stats
    ledger.close()
    engine.dispose()
    shutil.rmtree(spool, ignore_errors=True)
    waits.sort()
    return {
        "backend": name,
        "concurrency": concurrency,
        "writes": len(waits),
        "writes_per_s": len(waits) / elapsed,
        "commits": stats.batches,
        "durable_wait_p50_ms": _pct(waits, 50) * 1000,
        "durable_wait_p99_ms": _pct(waits, 99) * 1000,
    }


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--streams", type=int, default=12)
    ap.add_argument("--tenants", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--kill-every", type=float, default=0.0, help="kill -9 + restart every S seconds")
    ap.add_argument("--db-outage", type=float, default=0.0, help="stop PostgreSQL for S seconds (root)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ledger-only", action="store_true", help="only the in-process durable-write latency table")
    ap.add_argument("--postgres-url", default="", help="also measure the ledger on this (empty) PostgreSQL database")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.streams = 10, 6
    micro_dir = Path(tempfile.mkdtemp(prefix="soak-ledger-"))
    targets = [("sqlite", f"sqlite:///{micro_dir / 'ledger.db'}")] + (
        [("postgres", args.postgres_url)] if args.postgres_url else []
    )
    micro = [ledger_latency(n, u, c, 25 if args.quick else 100) for n, u in targets for c in (1, 16, 64)]
    shutil.rmtree(micro_dir, ignore_errors=True)
    print_table(
        micro,
        ["backend", "concurrency", "writes", "writes_per_s", "commits", "durable_wait_p50_ms", "durable_wait_p99_ms"],
    )
    print()
    if args.ledger_only:
        write_json("soak_ledger", {"args": vars(args), "ledger": micro})
        return 0
    from loraplex.engine.demo_model import ensure_demo_model

    model = Path(ensure_demo_model(Path(tempfile.gettempdir()) / "loraplex-soak-model"))
    rows = [
        soak("writer", args, model, durable=False, kill_every=0, outage=0),
        soak("ledger", args, model, durable=True, kill_every=0, outage=0),
    ]
    if args.kill_every:
        rows.append(soak("ledger+kill", args, model, durable=True, kill_every=args.kill_every, outage=0))
    if args.db_outage:
        rows.append(soak("ledger+outage", args, model, durable=True, kill_every=0, outage=args.db_outage))
    for r in rows[1:]:
        r["admission_p50_+ms"] = r["ttft_p50_ms"] - rows[0]["ttft_p50_ms"]
        r["admission_p99_+ms"] = r["ttft_p99_ms"] - rows[0]["ttft_p99_ms"]
    print_table(
        rows,
        [
            "config",
            "restarts",
            "outages",
            "sent",
            "succeeded",
            "failed",
            "http_503",
            "cut_streams",
            "tokens_delivered",
            "tokens_billed",
            "records_lost",
            "ttft_p50_ms",
            "ttft_p99_ms",
            "admission_p50_+ms",
            "admission_p99_+ms",
        ],
    )
    path = write_json("soak", {"args": vars(args), "results": rows, "ledger": micro})
    print(f"\nwrote {path}")
    return 1 if any(r["records_lost"] for r in rows if r["config"] != "writer") else 0


if __name__ == "__main__":
    sys.exit(main())
