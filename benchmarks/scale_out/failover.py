"""``benchmarks/scale_out/bench.py --scenario replica-kill``: kill -9 of an engine replica under N
concurrent streams (half greedy, half seeded sampling), per round:

- client-visible errors (a non-200 or an SSE error event) — the goal is 0: a stream the dead
  replica served resumes on another from its checkpoint;
- answers equal to an uninterrupted run of the same requests (run first, on the same cluster);
- the usage ledger against what each client received (tokens counted one by one from logprobs);
- the stall a resumed stream saw: its longest gap between two tokens around the kill, next to the
  longest gap of the streams the kill did not touch (the box's own jitter)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter

import httpx

from benchmarks.scale_out.faults import _usage_check


def _body(i: int, max_tokens: int) -> dict:
    body = {"model": "demo", "prompt": f"Story number {i}:", "max_tokens": max_tokens, "ignore_eos": True}
    return {**body, **({"temperature": 1.0, "seed": 500 + i} if i % 2 else {"temperature": 0})}


async def _stream(c: httpx.AsyncClient, body: dict, first: asyncio.Event, res: dict) -> dict:
    """One streamed completion into ``res``: text, tokens counted from logprobs, token arrival
    times, errors, the replica header (there as soon as the response starts)."""
    body = {**body, "logprobs": 1, "stream": True}
    res.update({"status": 0, "id": "", "text": "", "tokens": 0, "errors": 0, "times": [], "replica": ""})
    try:
        async with c.stream("POST", "/v1/completions", json=body) as r:
            res["status"], res["replica"] = r.status_code, r.headers.get("x-loraplex-replica", "")
            if r.status_code != 200:
                await r.aread()
                res["errors"] += 1
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                if "error" in ev:
                    res["errors"] += 1
                    continue
                res["id"] = ev["id"].removeprefix("cmpl-")
                for ch in ev.get("choices", []):
                    n = len((ch.get("logprobs") or {}).get("tokens") or [])
                    res["tokens"] += n
                    res["text"] += ch.get("text") or ""
                    res["times"].extend([time.perf_counter()] * n)
                if res["tokens"]:
                    first.set()
    finally:
        first.set()
    return res


def _max_gap(times: list[float]) -> float:
    return max((b - a for a, b in zip(times, times[1:])), default=0.0)


def replica_kill(server, key: str, tenant_id: str, streams: int, max_tokens: int) -> dict:
    """One round: the uninterrupted answers, then the same streams with the replica serving most
    of them killed once every stream has its first token."""
    reps = {r["replica"]: r for r in server.replicas()}

    async def run() -> tuple[list[dict], list[dict], str]:
        async with httpx.AsyncClient(
            base_url=server.url,
            headers={"Authorization": f"Bearer {key}"},
            timeout=600,
            limits=httpx.Limits(max_connections=streams + 4),
        ) as c:
            answers = await asyncio.gather(
                *[c.post("/v1/completions", json=_body(i, max_tokens)) for i in range(streams)]
            )
            firsts = [asyncio.Event() for _ in range(streams)]
            results = [{} for _ in range(streams)]
            tasks = [
                asyncio.create_task(_stream(c, _body(i, max_tokens), firsts[i], results[i])) for i in range(streams)
            ]
            await asyncio.wait_for(asyncio.gather(*[f.wait() for f in firsts]), 600)
            running = Counter(r["replica"] for r, t in zip(results, tasks) if not t.done() and r.get("replica"))
            victim = running.most_common(1)[0][0] if running else next(iter(reps))
            os.kill(int(reps[victim]["pid"]), signal.SIGKILL)
            await asyncio.gather(*tasks)
            return [a.json() for a in answers], results, victim

    oracle, results, victim = asyncio.run(run())
    killed_at = time.monotonic()
    replaced_after = None
    while time.monotonic() - killed_at < 600:  # the next round starts with two live replicas again
        now = server.replicas()
        if len(now) == 2 and reps[victim]["pid"] not in {r["pid"] for r in now}:
            replaced_after = round(time.monotonic() - killed_at, 1)
            break
        time.sleep(1.0)
    on_victim = [r for r in results if r["replica"] == victim]
    others = [r for r in results if r["replica"] != victim]
    equal = [r["text"] == o["choices"][0]["text"] for r, o in zip(results, oracle)]
    usage = _usage_check(
        server.db_path, tenant_id, [(r["status"], r["id"], r["tokens"], r["replica"]) for r in results]
    )
    return {
        "streams": streams,
        "on_killed_replica": len(on_victim),
        "client_visible_errors": sum(1 for r in results if r["errors"] or r["status"] != 200),
        "complete": sum(1 for r in results if r["tokens"] == max_tokens),
        "greedy_equal": f"{sum(e for i, e in enumerate(equal) if i % 2 == 0)}/{(streams + 1) // 2}",
        "seeded_equal": f"{sum(e for i, e in enumerate(equal) if i % 2)}/{streams // 2}",
        "resumed_max_gap_s": round(max((_max_gap(r["times"]) for r in on_victim), default=0.0), 2),
        "untouched_max_gap_s": round(max((_max_gap(r["times"]) for r in others), default=0.0), 2),
        "all_replaced_after_streams_s": replaced_after,
        **usage,
    }
