"""Does a black-holed adapter store slow anyone else down?

A real server (uvicorn in this process, the tiny-random model, SQLite, a database pool of 2
connections) with adapters registered by reference on a real S3-compatible store (moto). Two
phases, in one process: "control" (no uncached adapter requested) and "black-holed" (the store's
address leads into a TCP socket that accepts and never answers, while 8 requests for 8 distinct
uncached adapters wait on it). In each, 40 base-model completions and 40 admin API calls
(``GET /admin/v1/adapters``) are timed one after the other. Reported: p50 / p95 of each, and the
pooled connections checked out while the fetches were stuck.

    .venv/bin/python -m benchmarks.serving.store_blackhole
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import platform as std_platform
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.lib.paths import RESULTS

ADMIN_KEY = "lpx-admin-benchmark-key-0123456789"
H = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _small_pool() -> None:
    import sqlalchemy

    import loraplex.platform.db.session as db_session

    real = sqlalchemy.create_engine
    db_session.create_engine = lambda url, **kw: real(url, **{**kw, "pool_size": 2, "max_overflow": 0})  # type: ignore[attr-defined]


def _timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    import httpx
    import openai

    from loraplex.platform.adapters.sources.cache import DiskCache
    from loraplex.platform.adapters.sources.resolver import AdapterResolver
    from loraplex.platform.adapters.sources.s3 import S3Fetcher
    from loraplex.platform.adapters.sources.serving import ServedReferences
    from loraplex.platform.app import build_context, create_app
    from loraplex.platform.settings import load_settings
    from tests.harness.adapters import adapter_files, make_peft_adapter
    from tests.harness.live import LiveServer
    from tests.harness.s3 import CREDENTIALS, MotoServer, RawStore

    os.environ.update(CREDENTIALS)
    _small_pool()
    root = Path(tempfile.mkdtemp(prefix="store-bench-"))
    store = MotoServer(root)
    hole = RawStore("hole")
    settings = load_settings(
        data_dir=root / "data",
        admin_key=ADMIN_KEY,
        engine={"model": "tiny-random", "max_lora_rank": 8},
        adapters={"s3_endpoint_url": store.url, "fetch_timeout_s": 600.0},
    )
    ctx, _ = build_context(settings)
    server = LiveServer(create_app(ctx), ctx)
    url = server.url
    c = httpx.Client(base_url=url, headers=H, timeout=600)
    tid = c.post("/admin/v1/tenants", json={"name": "bench"}).json()["id"]
    key = c.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"]
    files = adapter_files(make_peft_adapter(Path(ctx.engine.model_dir), root / "adapter"))
    for i in range(8):
        source = store.put_folder("adapters", f"a{i}/", {**files, "README.md": f"adapter {i}".encode()})
        r = c.post("/admin/v1/adapters", json={"name": f"a{i}", "source": source, "tenant_id": tid})
        assert r.status_code == 201, r.text
    # from here on the store's address is the black hole, and nothing is cached yet
    resolver = AdapterResolver(
        DiskCache(root / "cache2", 1 << 30),
        {"s3": S3Fetcher(hole.url, "us-east-1", 600.0, 600.0, 1)},
        max_members=16,
        max_bytes=1 << 28,
        fetch_timeout_s=600.0,
        per_store=8,
        queued_per_store=8,
    )
    ctx.sources = ServedReferences(resolver, ctx.engine)
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=600)
    model = ctx.engine.model_name

    def base() -> None:
        client.completions.create(model=model, prompt="hello", max_tokens=4)

    def admin() -> None:
        assert c.get("/admin/v1/adapters").status_code == 200

    rows = []
    base()  # warm up
    rows.append({"phase": "control", "base_ms": _timed(base, 40), "admin_ms": _timed(admin, 40), "checked_out": 0})
    pool = concurrent.futures.ThreadPoolExecutor(8)
    stuck = [
        pool.submit(lambda m=f"a{i}": client.completions.create(model=m, prompt="x", max_tokens=2)) for i in range(8)
    ]
    while hole.accepted < 8:
        time.sleep(0.05)
    checked = ctx.db_engine.pool.checkedout()
    rows.append(
        {"phase": "black-holed", "base_ms": _timed(base, 40), "admin_ms": _timed(admin, 40), "checked_out": checked}
    )
    still_waiting = sum(not f.done() for f in stuck)
    load = os.getloadavg()
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo"], capture_output=True, text=True).stdout
    print(f"machine: {cpu.strip()} ({std_platform.machine()}), load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print(f"stuck requests still waiting on the store at the end: {still_waiting} of 8")
    print(f"{'phase':<12} {'base p50':>9} {'base p95':>9} {'admin p50':>10} {'admin p95':>10} {'DB conns held':>14}")
    for r in rows:
        b, a = r["base_ms"], r["admin_ms"]
        print(
            f"{r['phase']:<12} {_pct(b, 0.5):>8.1f}ms {_pct(b, 0.95):>8.1f}ms {_pct(a, 0.5):>9.1f}ms {_pct(a, 0.95):>9.1f}ms"
            f" {r['checked_out']:>14}"
        )
    RESULTS.mkdir(exist_ok=True)
    summary = [
        {
            "phase": r["phase"],
            "base_p50_ms": _pct(r["base_ms"], 0.5),
            "base_p95_ms": _pct(r["base_ms"], 0.95),
            "admin_p50_ms": _pct(r["admin_ms"], 0.5),
            "admin_p95_ms": _pct(r["admin_ms"], 0.95),
            "db_connections_held": r["checked_out"],
        }
        for r in rows
    ]
    (RESULTS / "store_blackhole.json").write_text(json.dumps({"load": load, "rows": summary}, indent=2))
    print(f"wrote {RESULTS / 'store_blackhole.json'}")
    hole.close()
    store.close()
    os._exit(0)  # the stuck fetch threads wait on the black hole; do not wait for them


if __name__ == "__main__":
    main()
