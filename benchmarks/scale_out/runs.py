"""``benchmarks/scale_out/bench.py --scenario ...``: each scenario on fresh servers, alternating the
configurations it compares, one printed table per scenario and one JSON file for all."""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
from pathlib import Path

import httpx

from benchmarks.lib.paths import RESULTS
from benchmarks.scale_out.failover import replica_kill
from benchmarks.scale_out.faults import kill_control, rolling_restart, sigterm_drain
from benchmarks.scale_out.scenarios import autoscale, flood, last_usage_id, ledger_ttft_ms, sessions


def _tenant(server, name: str, adapters: list[bytes] = ()) -> tuple[str, str, list[str]]:
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=120) as c:
        tid = c.post("/admin/v1/tenants", json={"name": name}).json()["id"]
        key = c.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"]
        names = []
        for i, data in enumerate(adapters):
            n = f"{name}-a{i}"
            r = c.post("/admin/v1/adapters", data={"name": n, "tenant_id": tid}, files={"file": (f"{n}.zip", data)})
            r.raise_for_status()
            names.append(n)
    return tid, key, names


def _server(Server, model: Path, replicas: int, routing: str, args, extra: str = ""):
    root = Path(tempfile.mkdtemp(prefix=f"lpx-scenario-{routing}-"))
    return Server(root, model, replicas, routing, args, extra)


def _s(x: float | None) -> str:
    return "never" if x is None else f"{x:.1f} s"


def run_scenarios(args: argparse.Namespace, model: Path, archives: list[bytes], Server) -> None:
    picked = args.scenario.split(",")
    out: dict[str, object] = {"args": vars(args), "cpu_cores": os.cpu_count(), "load_avg_start": os.getloadavg()}
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"scale_out_scenarios-{args.scenario.replace(',', '-')}.json"

    def save() -> None:  # after each scenario: a later one failing (a loaded box) keeps the earlier ones
        out["load_avg_end"] = os.getloadavg()
        path.write_text(json.dumps(out, indent=2, default=str))

    if "sessions" in picked:
        rows = []
        for routing in ("prefix", "affinity", "load"):
            srv = _server(Server, model, 2, routing, args)
            try:
                _tid, key, names = _tenant(srv, "chat", archives[:2])
                models = ["demo", names[0], "demo", names[1]]
                rows.append({"routing": routing, **sessions(srv, key, models, args.sessions, args.turns, 8)})
            finally:
                srv.stop()
        print(f"\nmulti-turn sessions: {args.sessions} sessions x {args.turns} turns, 2 replicas")
        print(f"{'routing':<10} {'prefix hit':>10} {'TTFT p50 (turn 2+)':>19} {'p90':>8} {'switches':>9}")
        for r in rows:
            print(
                f"{r['routing']:<10} {r['prefix_hit_rate']:10.2f} {r['ttft_later_p50_ms']:17.0f}ms "
                f"{r['ttft_later_p90_ms']:6.0f}ms {r['replica_switches']:9d}"
            )
        out["sessions"] = rows
        save()
    if "flood" in picked:
        small = copy.copy(args)
        small.max_num_seqs = args.flood_max_num_seqs  # both tenants stay backlogged
        rows = []
        for share in ("false", "true"):  # fair-share preemption off (before) / on (after)
            small.fair_share_preemption = share
            srv = _server(Server, model, 2, "affinity", small)
            try:
                ftid, fkey, _ = _tenant(srv, "flooder")
                ltid, lkey, lnames = _tenant(srv, "light", archives[:1])
                for streams in (8, 2):
                    mark = last_usage_id(srv.db_path)
                    res = flood(
                        srv, fkey, lkey, lnames[0], args.flood_seconds, args.flood_tokens, streams, args.flood_streams
                    )
                    res["light_ledger_ttft_p50_ms"] = ledger_ttft_ms(srv.db_path, ltid, mark)
                    res["flooder_ledger_ttft_p50_ms"] = ledger_ttft_ms(srv.db_path, ftid, mark)
                    rows.append({"share_preemption": share, "light_streams": streams, **res})
            finally:
                srv.stop()
        print(
            f"\ntwo-tenant flood, {args.flood_seconds:.0f} s per row, 2 replicas x max_num_seqs "
            f"{args.flood_max_num_seqs}: F = {args.flood_streams} streams on the base model, L on one adapter, "
            f"{args.flood_tokens} tokens each; client TTFT p50 (ledger TTFT p50: admission to first token)"
        )
        print(
            f"{'share pre.':<10} {'L streams':>9} {'F tok/s':>8} {'L tok/s':>8} {'Jain':>6} "
            f"{'L TTFT':>15} {'F TTFT':>15} {'L/F':>5} {'L/F ledger':>10}"
        )
        for r in rows:
            lr = r["light_ledger_ttft_p50_ms"] / r["flooder_ledger_ttft_p50_ms"]
            print(
                f"{r['share_preemption']:<10} {r['light_streams']:9d} {r['flooder_tok_s']:8.1f} {r['light_tok_s']:8.1f} "
                f"{r['jain']:6.3f} {r['light_ttft_p50_ms']:6.0f} ({r['light_ledger_ttft_p50_ms']:5.0f}) "
                f"{r['flooder_ttft_p50_ms']:6.0f} ({r['flooder_ledger_ttft_p50_ms']:5.0f}) "
                f"{r['ttft_ratio']:5.2f} {lr:10.2f}"
            )
        out["flood"] = rows
        save()
    if "kill" in picked:  # the control actor killed --kill-rounds times on one cluster
        srv = _server(Server, model, 2, "affinity", args)
        rounds = []
        try:
            tenants = {}
            for label, quota in (("no limit", None), ("rpm limit", {"rpm": 1_000_000})):
                tid, key, _ = _tenant(srv, f"kill-{label.replace(' ', '-')}")
                if quota:  # a limit never reached: its admissions wait for the restarted actor
                    with httpx.Client(base_url=srv.url, headers=srv.headers, timeout=120) as c:
                        c.put(f"/admin/v1/tenants/{tid}/quota", json=quota).raise_for_status()
                tenants[label] = (tid, key)
            for _ in range(args.kill_rounds):
                rounds.append(kill_control(srv, tenants, args.fault_clients, args.fault_tokens, args.fault_cap_s))
                out["kill"] = rounds
                save()
        finally:
            srv.stop()
        print(
            f"\ncontrol actor SIGKILL x {len(rounds)} (2 replicas, {args.fault_clients} closed-loop streams of "
            f"{args.fault_tokens} tokens, two tenants): seconds after the kill"
        )
        print(
            f"{'round':<6} {'new actor':>9} {'admitting':>9} {'probe, no limit':>15} {'probe, rpm limit':>16} "
            f"{'loop 1st token (no limit / rpm)':>31} {'non-200':>7} {'rows missing / != received':>26}"
        )
        for i, k in enumerate(rounds, 1):
            nl, rl = k["no limit"], k["rpm limit"]
            print(
                f"{i:<6} {_s(k['new_instance_started_after_kill_s']):>9} "
                f"{_s(k['limited_holds_admitted_again_after_kill_s']):>9} "
                f"{_s(nl['probe_first_token_after_kill_s']):>15} {_s(rl['probe_first_token_after_kill_s']):>16} "
                f"{_s(nl['first_token_after_kill_s']) + ' / ' + _s(rl['first_token_after_kill_s']):>31} "
                f"{nl['errors'] + rl['errors']:7d} "
                f"{str(nl['rows_missing'] + rl['rows_missing']) + ' / ' + str(nl['rows_not_equal_received'] + rl['rows_not_equal_received']):>26}"
            )
    if "replica-kill" in picked:  # an engine replica SIGKILLed under streams, --kill-rounds times
        srv = _server(Server, model, 2, "affinity", args)
        rounds = []
        try:
            tid, key, _ = _tenant(srv, "replica-kill")
            for _ in range(args.kill_rounds):
                rounds.append(replica_kill(srv, key, tid, args.kill_streams, args.fault_tokens))
                out["replica_kill"] = rounds
                save()
        finally:
            srv.stop()
        print(
            f"\nengine replica SIGKILL x {len(rounds)} (2 replicas, {args.kill_streams} streams of "
            f"{args.fault_tokens} tokens, half greedy, half seeded)"
        )
        print(
            f"{'round':<6} {'on victim':>9} {'errors':>6} {'complete':>8} {'greedy =':>8} {'seeded =':>8} "
            f"{'max gap resumed':>15} {'untouched':>9} {'rows != received':>16} {'received / billed':>17}"
        )
        for i, k in enumerate(rounds, 1):
            print(
                f"{i:<6} {k['on_killed_replica']:9d} {k['client_visible_errors']:6d} {k['complete']:8d} "
                f"{k['greedy_equal']:>8} {k['seeded_equal']:>8} {k['resumed_max_gap_s']:14.1f}s "
                f"{k['untouched_max_gap_s']:8.1f}s {k['rows_missing'] + k['rows_not_equal_received']:16d} "
                f"{str(k['tokens_received']) + ' / ' + str(k['tokens_billed']):>17}"
            )
    if "faults" in picked:  # one cluster: control actor kill, rolling restart, SIGTERM drain
        srv = _server(Server, model, 2, "affinity", args, "drain_timeout_s = 600")
        try:
            tid, key, _ = _tenant(srv, "faults")
            ltid, lkey, _ = _tenant(srv, "faults-limited")
            with httpx.Client(base_url=srv.url, headers=srv.headers, timeout=120) as c:  # a limit never reached
                c.put(f"/admin/v1/tenants/{ltid}/quota", json={"rpm": 1_000_000}).raise_for_status()
            tenants = {"no limit": (tid, key), "rpm limit": (ltid, lkey)}
            kill = kill_control(srv, tenants, args.fault_clients, args.fault_tokens, args.fault_cap_s)
            save_part = {"kill_control": kill}
            out["faults"] = save_part
            save()
            tid, key, _ = _tenant(srv, "rolling")
            roll = rolling_restart(srv, key, tid, args.fault_clients, args.fault_tokens, 3 * args.fault_cap_s)
            save_part["rolling_restart"] = roll
            save()
            tid, key, _ = _tenant(srv, "drain")
            drain = sigterm_drain(srv, key, tid, args.fault_clients, 4 * args.fault_tokens)
            save_part["sigterm_drain"] = drain
        finally:
            srv.stop()
        print(f"\nfaults (2 replicas, {args.fault_clients} closed-loop streams of {args.fault_tokens} tokens):")
        for label in tenants:
            k = kill[label]
            print(
                f"  control actor SIGKILL, tenant with {label}: a request sent after the kill: first token "
                f"{_s(k['first_token_after_kill_s'])}, first completed {_s(k['first_completed_after_kill_s'])} "
                f"after the kill; statuses {k['status_counts']}; rows missing {k['rows_missing']}, rows != "
                f"received {k['rows_not_equal_received']}; received {k['tokens_received']} billed {k['tokens_billed']}"
            )
        print(
            f"  rolling restart (SIGHUP): complete after {roll['complete_after_s']} s; {roll['cut_or_failed']} of "
            f"{roll['requests']} requests cut or failed; replicas replaced {roll['replaced']} "
            f"({roll['replicas_before']} -> {roll['replicas_after']}); most streams a stopping replica drained "
            f"{roll['max_ongoing_while_draining']}; rows missing {roll['rows_missing']}, rows != received "
            f"{roll['rows_not_equal_received']}; received {roll['tokens_received']} billed {roll['tokens_billed']}"
        )
        print(
            f"  SIGTERM drain: {drain['streams_completed']}/{drain['streams']} streams completed, "
            f"received {drain['tokens_received']} billed {drain['tokens_billed']} tokens ({drain['rows_ok']} rows ok), "
            f"drained after {drain['drained_after_sigterm_s']} s, exit {drain['exit_code']} after "
            f"{drain['exit_after_sigterm_s']:.1f} s"
        )
        save()
    if "autoscale" in picked:
        extra = "min_replicas = 1\nmax_replicas = 2\ntarget_ongoing_requests = 4\nupscale_delay_s = 5\ndownscale_delay_s = 15"
        srv = _server(Server, model, 2, "affinity", args, extra)
        try:
            _t, key, _ = _tenant(srv, "scale")
            auto = autoscale(srv, key, 32, args.flood_seconds)
        finally:
            srv.stop()
        print(
            f"\nautoscaling min 1 / max 2 (from 2): idle down at {auto['scaled_down_idle_at_s']} s, up under load "
            f"at {auto['scaled_up_at_s']} s, down again at {auto['scaled_down_at_s']} s, "
            f"max seen {auto['max_replicas_seen']}, {auto['cut_or_failed']} of {auto['requests']} requests cut"
        )
        out["autoscale"] = auto
        save()
    save()
    print(f"wrote {path}")
