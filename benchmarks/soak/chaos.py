"""Chaos soak (the companion of billing.py): mixed request kinds against real ``loraplex serve``
processes on one private PostgreSQL database while faults happen, then a per-request reconciliation.

    .venv/bin/python -m benchmarks.soak.chaos --seconds 480 --clients 8 --complete-between 60  # root (private PG)

Request kinds (kinds.py, round robin per client): streaming (n=1 and n=2), non-streaming,
n=3, a prompt list, chat with tools, chat with a json_schema, a client that gives up mid-answer,
hostile bodies (lone surrogates in ``user`` and in tool-call arguments, int overflows, n=10^9, a NUL
in the model name, a malformed tool: each must be a 4xx). Three tenants: one with a tpm limit, one
with a daily token budget, one with max_concurrent only; the limits are small enough to be reached.

Faults, at fractions of --seconds and each only once --complete-between more requests completed
since the previous one (so a slow machine still completes hundreds of requests between faults; a
server start is bounded only by --start-timeout): server B started on the same database next to A
(clients alternate), kill -9 of A (restarted on its data dir while B serves on), PostgreSQL stopped
for --outage seconds, SIGTERM of A while it serves (a rolling restart: B serves on), A started
again next to B. After the plan the run goes on until --seconds and --complete-between more
completions.

Reconciliation from the final export of the usage ledger:
- records lost: a complete response without an ``ok`` record
- billed != delivered: complete responses whose record bills other completion tokens than the
  client counted (completions: the logprob tokens it received; chat: its usage)
- cut over-billed: streams cut by a fault billed more than the client received
- hung: requests that never answered within the client timeout (180 s)
- slots leaked: ``running`` in each tenant's quota consumption on every live server at the end,
  and ledger rows still ``running``
- quota overshoot: the most tokens in any 60 s window of admissions of the tpm tenant over its tpm,
  and the budget tenant's billed tokens over its budget (% of the limit)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx

from benchmarks.lib.workload import print_table, write_json
from benchmarks.soak.billing import H, start_server
from benchmarks.soak.kinds import KINDS, Outcome, send
from tests.harness.net import free_port
from tests.harness.postgres import PostgresServer
from tests.harness.serve import ServeProcess

WINDOW_S = 60.0


@dataclass
class Chaos:
    urls: list[str]
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    load: list[float] = field(default_factory=list)
    pauses: list[tuple[float, float]] = field(default_factory=list)  # (from, to), monotonic
    active_s: float = 0.0  # run time less the pauses


def watch_pauses(chaos: Chaos) -> None:
    """A shared machine may stop every process of this run for a while (SIGSTOP while someone else
    measures): the plan runs on active time, and a client timeout across a pause is not a hang."""
    last = time.monotonic()
    while not chaos.stop.is_set():
        time.sleep(0.5)
        now = time.monotonic()
        gap = now - last
        if gap > 3.0:
            chaos.pauses.append((last, now))
        else:
            chaos.active_s += gap
            chaos.load.append(os.getloadavg()[0])
        last = now


def paused_during(chaos: Chaos, o: Outcome) -> bool:
    return any(a < o.ended and b > o.started for a, b in chaos.pauses)


def client(chaos: Chaos, i: int, keys: list[str], model: str, max_tokens: int) -> None:
    for n in itertools.count():
        if chaos.stop.is_set():
            return
        kind = KINDS[(i + n) % len(KINDS)]
        tenant = (i + n) % len(keys)
        urls = chaos.urls
        o = send(urls[n % len(urls)], keys[tenant], model, kind, tenant, max_tokens, n // len(KINDS))
        with chaos.lock:
            chaos.outcomes.append(o)
        if o.status in (-1, 429, 503):
            time.sleep(0.5)


def tpm_peak(rows: list[dict]) -> int:
    """The most tokens (prompt + completion) admitted within any 60 s window (anchored at each
    admission; the window is 0.5 s shorter than the limiter's so clock rounding never adds one)."""
    times = sorted(
        (datetime.fromisoformat(r["created_at"]).timestamp(), r["prompt_tokens"] + r["completion_tokens"]) for r in rows
    )
    peak, j, total = 0, 0, 0
    for i, (t, _tok) in enumerate(times):
        while j < len(times) and times[j][0] < t + WINDOW_S - 0.5:
            total += times[j][1]
            j += 1
        peak = max(peak, total)
        total -= times[i][1]
    return peak


def _start(root: Path, name: str, model: Path, env: dict, port: int, args) -> ServeProcess:
    return start_server(root / name / "data", model, env, port, start_timeout=args.start_timeout)


def run(args) -> dict:
    from loraplex.engine.demo_model import ensure_demo_model

    model = Path(ensure_demo_model(Path(tempfile.gettempdir()) / "loraplex-soak-model"))
    root = Path(tempfile.mkdtemp(prefix="soak-chaos-"))
    pg = PostgresServer(database="soak")
    env = {
        "LORAPLEX_DATABASE_URL": pg.url,
        "LORAPLEX_ENGINE__MAX_NUM_SEQS": "16",
        "LORAPLEX_AUTH__KEY_CACHE_TTL_S": "60",
        "LORAPLEX_LEDGER__CHECKPOINT_INTERVAL_S": "0.5",
        "LORAPLEX_LEDGER__LEASE_TTL_S": "6",
        "LORAPLEX_SECRET_KEY": "soak-chaos-shared-secret-0123456789",  # servers on one DB share it
    }
    for name in ("a", "b"):
        (root / name).mkdir()
    port_a = free_port()
    servers: dict[str, ServeProcess | None] = {"a": _start(root, "a", model, env, port_a, args), "b": None}
    faults: list[str] = []
    errors: list[str] = []
    rows: dict[str, dict] = {}
    running: list[int] = []
    tids: list[str] = []
    chaos = Chaos([servers["a"].url])  # type: ignore[union-attr]
    t0 = time.monotonic()
    try:
        a_url = chaos.urls[0]
        keys = []
        quotas = [{"tpm": args.tpm}, {"token_budget": args.budget, "budget_period": "day"}, {"max_concurrent": 4}]
        for t, quota in enumerate(quotas):
            tid = httpx.post(a_url + "/admin/v1/tenants", json={"name": f"t{t}"}, headers=H).json()["id"]
            keys.append(httpx.post(a_url + f"/admin/v1/tenants/{tid}/keys", json={}, headers=H).json()["key"])
            httpx.put(a_url + f"/admin/v1/tenants/{tid}/quota", json=quota, headers=H).raise_for_status()
            tids.append(tid)
        base = httpx.get(a_url + "/v1/models", headers={"Authorization": f"Bearer {keys[0]}"}).json()["data"][0]["id"]
        threads = [
            threading.Thread(target=client, args=(chaos, i, keys, base, args.max_tokens), daemon=True)
            for i in range(args.clients)
        ]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        threading.Thread(target=watch_pauses, args=(chaos,), daemon=True).start()
        plan = [
            (0.1, "start B"),
            (0.3, "kill -9 A"),
            (0.5, "PostgreSQL outage"),
            (0.65, "SIGTERM A"),
            (0.8, "start A"),
        ]

        def completed() -> int:
            with chaos.lock:
                return sum(o.complete for o in chaos.outcomes)

        for at, fault in plan:
            floor = completed() + args.complete_between
            while chaos.active_s < at * args.seconds or (completed() < floor and chaos.active_s < 3 * args.seconds):
                time.sleep(0.5)
            try:
                fault_once(fault, servers, chaos, pg, root, model, env, port_a, args)
                faults.append(f"{fault} @{chaos.active_s:.0f}s")
            except Exception as exc:  # a fault that went wrong is reported, the soak goes on
                errors.append(f"{fault}: {type(exc).__name__}: {exc}")
                traceback.print_exc()
        floor = completed() + args.complete_between
        while chaos.active_s < args.seconds or (completed() < floor and chaos.active_s < 3 * args.seconds):
            time.sleep(0.5)
        chaos.stop.set()
        for t in threads:
            t.join(240)
        live = [s for s in servers.values() if s is not None and s.proc.poll() is None]
        for srv in live:  # let spools drain before reconciling
            deadline = time.time() + 120
            while time.time() < deadline and httpx.get(srv.url + "/ready", timeout=30).json().get("usage_spool"):
                time.sleep(0.5)
        for srv in live:
            for tid in tids:
                r = httpx.get(srv.url + f"/admin/v1/tenants/{tid}/quota/consumption", headers=H, timeout=60)
                running.append(r.json()["running"])
        export = httpx.get(live[0].url + "/admin/v1/usage/export", params={"format": "jsonl"}, headers=H, timeout=120)
        rows = {r["request_id"]: r for r in map(json.loads, export.text.splitlines())}
    finally:
        chaos.stop.set()
        for srv in servers.values():
            if srv is not None:
                srv.stop()
        pg.destroy()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}")
    return reconcile(args, chaos, rows, tids, running, faults, errors, time.monotonic() - t0)


def fault_once(fault: str, servers: dict, chaos: Chaos, pg, root, model, env, port_a, args) -> None:
    if fault == "kill -9 A":  # B serves on while A restarts on its data dir
        chaos.urls = [servers["b"].url]
        servers["a"].kill()
        servers["a"] = _start(root, "a", model, env, port_a, args)
        chaos.urls = [servers["a"].url, servers["b"].url]
    elif fault == "start B":
        servers["b"] = _start(root, "b", model, env, free_port(), args)
        chaos.urls = [servers["a"].url, servers["b"].url]
    elif fault == "PostgreSQL outage":
        pg.stop()
        time.sleep(args.outage)
        pg.start()
    elif fault == "SIGTERM A":  # a rolling restart: A stops taking new clients and drains
        chaos.urls = [servers["b"].url]
        servers["a"].proc.send_signal(signal.SIGTERM)
        servers["a"].proc.wait(args.start_timeout)
    elif fault == "start A":
        servers["a"] = _start(root, "a", model, env, port_a, args)
        chaos.urls = [servers["a"].url, servers["b"].url]


def reconcile(args, chaos: Chaos, rows: dict, tids: list[str], running: list[int], faults, errors, took) -> dict:
    outs = chaos.outcomes
    complete = [o for o in outs if o.complete]
    lost = [o for o in complete if o.request_id not in rows or rows[o.request_id]["status"] != "ok"]
    mismatch = [o for o in complete if o.request_id in rows and rows[o.request_id]["completion_tokens"] != o.received]
    usage_lies = [o for o in complete if o.kind != "list" and o.usage != o.received]
    cut = [o for o in outs if o.cut and o.request_id]
    cut_over = [o for o in cut if o.request_id in rows and rows[o.request_id]["completion_tokens"] > (o.received or 0)]
    cut_missing = [o for o in cut if o.request_id not in rows]
    by_tenant = [[r for r in rows.values() if r["tenant_id"] == tid] for tid in tids]
    peak = tpm_peak(by_tenant[0]) if by_tenant else 0
    budget_billed = sum(r["prompt_tokens"] + r["completion_tokens"] for r in by_tenant[1]) if by_tenant else 0
    refused = {k: sum(o.status == 429 and o.tenant == t for o in outs) for t, k in enumerate(("tpm", "budget", "conc"))}
    load = sorted(chaos.load) or [float("nan")]
    return {
        "seconds": args.seconds,
        "took_s": round(took),
        "active_s": round(chaos.active_s),
        "clients": args.clients,
        "faults": ", ".join(faults),
        "fault_errors": errors,
        "requests": len(outs),
        "by_status": {str(s): sum(o.status == s for o in outs) for s in sorted({o.status for o in outs})},
        "by_kind_complete": {k: sum(o.kind == k for o in complete) for k in KINDS},
        "hostile_not_4xx": sum(o.kind == "hostile" and o.status > 0 and not 400 <= o.status < 500 for o in outs),
        "any_5xx": sum(o.status >= 500 and o.status != 503 for o in outs),
        "complete": len(complete),
        "records_lost": len(lost),
        "billed_ne_delivered": len(mismatch),
        "usage_ne_received": len(usage_lies),
        "cut_streams": len(cut),
        "cut_over_billed": len(cut_over),
        "cut_no_record": len(cut_missing),
        "hung": sum(o.hung and not paused_during(chaos, o) for o in outs),
        "timeouts_across_a_pause": sum(o.hung and paused_during(chaos, o) for o in outs),
        "machine_paused_s": round(sum(b - a for a, b in chaos.pauses)),
        "slots_leaked": sum(running),
        "rows_running": sum(r["status"] == "running" for r in rows.values()),
        "refused_429": refused,
        "tpm": args.tpm,
        "tpm_peak": peak,
        "tpm_overshoot_pct": max(0.0, (peak - args.tpm) / args.tpm * 100),
        "budget": args.budget,
        "budget_billed": budget_billed,
        "budget_overshoot_pct": max(0.0, (budget_billed - args.budget) / args.budget * 100),
        "records": len(rows),
        "statuses_in_ledger": {
            s: sum(r["status"] == s for r in rows.values()) for s in sorted({r["status"] for r in rows.values()})
        },
        "loadavg_1m_median": load[len(load) // 2],
        "examples": {
            "lost": [o.__dict__ for o in lost[:3]],
            "mismatch": [{**o.__dict__, "row": rows[o.request_id]} for o in mismatch[:3]],
            "cut_over": [{**o.__dict__, "row": rows[o.request_id]} for o in cut_over[:3]],
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=480)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--tpm", type=int, default=2000)
    ap.add_argument("--budget", type=int, default=4000)
    ap.add_argument("--outage", type=float, default=4.0)
    ap.add_argument("--complete-between", type=int, default=60, help="completed requests between two faults")
    ap.add_argument("--start-timeout", type=float, default=900, help="a loaded 2-core box starts a server slowly")
    ap.add_argument("--keep", action="store_true", help="keep the data dirs and server logs")
    args = ap.parse_args()
    result = run(args)
    cols = ["requests", "complete", "records_lost", "billed_ne_delivered", "cut_streams", "cut_over_billed", "hung"]
    cols += ["slots_leaked", "rows_running", "hostile_not_4xx", "any_5xx"]
    print_table([result], cols)
    print()
    print_table([result], ["tpm", "tpm_peak", "tpm_overshoot_pct", "budget", "budget_billed", "budget_overshoot_pct"])
    print()
    for k in (
        "took_s",
        "active_s",
        "machine_paused_s",
        "timeouts_across_a_pause",
        "faults",
        "fault_errors",
        "by_status",
        "by_kind_complete",
        "refused_429",
    ):
        print(f"{k}: {result[k]}")
    for k in ("statuses_in_ledger", "usage_ne_received", "cut_no_record", "loadavg_1m_median", "examples"):
        print(f"{k}: {result[k]}")
    path = write_json("soak_chaos", {"args": vars(args), "result": result})
    print(f"\nwrote {path}")
    bad = result["records_lost"] or result["billed_ne_delivered"] or result["hung"] or result["slots_leaked"]
    bad = bad or result["cut_over_billed"] or result["hostile_not_4xx"] or result["any_5xx"] or result["fault_errors"]
    return 1 if bad or result["tpm_overshoot_pct"] > 1 or result["budget_overshoot_pct"] > 1 else 0


if __name__ == "__main__":
    sys.exit(main())
