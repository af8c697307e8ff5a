"""Does the server's event loop stall while the engine steps? And how much of a step is not the model?

Part "health": a real `loraplex serve` (uvicorn) on the bench-preset random model; 24 streaming
completions with ~700-token prompts run at once while a client probes `/health` every 10 ms.
Reported: the probe's latency p50 / p99 / max (a stalled event loop shows up here, as every SSE
stream and every admission on the server freezes with it).

Part "steps": the engine in-process at batch 64 (decode-heavy); each step's wall time next to the
model runner's forward time. Reported: non-forward share = (schedule + bookkeeping + sampling +
detokenizing) / step.

Both parts run for this checkout and, with ``--before PYTHON``, for another checkout's interpreter
(a venv with an older loraplex installed), one after the other, so the table is before/after:

    .venv/bin/python -m benchmarks.serving.server_latency --before /path/to/old/.venv/bin/python
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.lib.paths import RESULTS, ROOT

ADMIN_KEY = "lpx-admin-benchmark-key-0123456789"


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def model_dir(root: Path) -> Path:
    from loraplex.engine.demo_model import ensure_demo_model

    return Path(ensure_demo_model(root / "bench-model", preset="bench"))


# ---------------------------------------------------------------------------------------- health
async def _health_run(url: str, key: str, n_streams: int, prompt_words: int, max_tokens: int) -> dict:
    import httpx

    rng = random.Random(0)
    probes: list[float] = []
    done = asyncio.Event()

    async def stream(client: httpx.AsyncClient, i: int) -> int:
        # Token ids, so the prompt is exactly this long on every server (no tokenizer differences).
        prompt = [rng.randrange(10, 690) for _ in range(prompt_words)]  # the bench vocab is 704
        body = {
            "model": "bench-model",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
        }
        chunks = 0
        async with client.stream("POST", "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if '"error"' in line:  # an older server answered refusals as 200 + an SSE error event
                    raise RuntimeError(f"stream {i} failed: {line[:300]}")
                chunks += line.startswith("data: ")
        return chunks

    async def probe(client: httpx.AsyncClient) -> None:
        while not done.is_set():
            t = time.perf_counter()
            r = await client.get("/health")
            probes.append((time.perf_counter() - t) * 1000)
            assert r.status_code == 200
            await asyncio.sleep(0.01)

    limits = httpx.Limits(max_connections=n_streams + 4)
    async with (
        httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as streams_client,
        httpx.AsyncClient(base_url=url, timeout=60) as probe_client,
    ):
        prober = asyncio.create_task(probe(probe_client))
        t0 = time.perf_counter()
        chunks = await asyncio.gather(*(stream(streams_client, i) for i in range(n_streams)))
        wall = time.perf_counter() - t0
        done.set()
        await prober
    return {
        "probes": len(probes),
        "health_p50_ms": statistics.median(probes),
        "health_p99_ms": _pct(probes, 0.99),
        "health_max_ms": max(probes),
        "streams": n_streams,
        "sse_chunks": sum(chunks),
        "wall_s": wall,
    }


def part_health(python: str, root: Path, n_streams: int, prompt_words: int, max_tokens: int) -> dict:
    import httpx

    from tests.harness.serve import ServeProcess

    data = Path(tempfile.mkdtemp(prefix="lpx-lat-", dir=root))
    env = {
        "LORAPLEX_ENGINE__MAX_NUM_SEQS": "32",
        # The same engine work on both sides (newer defaults pick bf16 and the native CPU kernels):
        # what differs is only how the server talks to the engine.
        "LORAPLEX_ENGINE__DTYPE": "float32",
        "LORAPLEX_ENGINE__KERNEL_BACKEND": "torch",
        "LORAPLEX_ENGINE__DEVICE": "cpu",
    }
    server = ServeProcess(data / "d", model_dir(root), admin_key=ADMIN_KEY, env=env, config=None, python=python)
    try:
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        tid = httpx.post(server.url + "/admin/v1/tenants", json={"name": "bench"}, headers=admin).json()["id"]
        key = httpx.post(server.url + f"/admin/v1/tenants/{tid}/keys", json={}, headers=admin).json()["key"]
        return asyncio.run(_health_run(server.url, key, n_streams, prompt_words, max_tokens))
    finally:
        server.stop(timeout=20)


# ---------------------------------------------------------------------------------------- steps
def part_steps(root: Path, batch: int, steps: int) -> dict:
    """In-process: wall time of LLMEngine.step() vs the model runner's forward inside it."""
    import torch

    from loraplex.engine import LLM, SamplingParams

    torch.set_num_threads(2)
    llm = LLM(
        model=str(model_dir(root)),
        max_num_seqs=batch,
        max_num_batched_tokens=2048,
        dtype="float32",
        kernel_backend="torch",
        num_kv_blocks=2048,
        block_size=16,
    )
    engine = llm.engine
    forward = [0.0]
    execute = engine.runner.forward

    def timed_execute(*args, **kwargs):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            return execute(*args, **kwargs)
        finally:
            forward[0] += time.perf_counter() - t

    engine.runner.forward = timed_execute  # type: ignore[method-assign]
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(max_tokens=steps + 50, temperature=0.8, top_p=0.95, seed=1, ignore_eos=True)
    for _ in range(batch):
        engine.add_request([rng.randrange(5, vocab) for _ in range(32)], params)
    for _ in range(5):  # prefill and warm-up
        engine.step()
    forward[0] = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    total = time.perf_counter() - t0
    return {
        "batch": batch,
        "steps": steps,
        "step_ms": total / steps * 1000,
        "forward_ms": forward[0] / steps * 1000,
        "non_forward_share": 1 - forward[0] / total,
    }


# ---------------------------------------------------------------------------------------- driver
def run_all(python: str, args: argparse.Namespace, root: Path) -> dict:
    health = part_health(python, root, args.streams, args.prompt_tokens, args.max_tokens)
    here = os.path.realpath(sys.executable) == os.path.realpath(python)
    if here:
        steps = part_steps(root, args.batch, args.steps)
    else:
        out = subprocess.run(
            [
                python,
                "-m",
                "benchmarks.serving.server_latency",
                "--part",
                "steps",
                "--root",
                str(root),
                "--batch",
                str(args.batch),
                "--steps",
                str(args.steps),
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,  # a module of this checkout, whatever interpreter runs it
        )
        steps = json.loads(out.stdout.strip().splitlines()[-1])
    return {**health, **steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", help="python of a venv with the older loraplex to compare against")
    ap.add_argument("--streams", type=int, default=24)
    ap.add_argument("--prompt-tokens", type=int, default=700)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--part", choices=["steps"], help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.part == "steps":
        print(json.dumps(part_steps(Path(args.root), args.batch, args.steps)))
        return
    root = Path(tempfile.mkdtemp(prefix="lpx-latency-"))
    rows = {}
    if args.before:
        rows["before"] = run_all(args.before, args, root)
    rows["after"] = run_all(sys.executable, args, root)
    print(f"\n{'':8} {'/health p50':>12} {'p99':>8} {'max':>8}   {'step ms':>8} {'forward ms':>10} {'non-fwd':>8}")
    for name, r in rows.items():
        print(
            f"{name:8} {r['health_p50_ms']:>10.1f}ms {r['health_p99_ms']:>6.1f}ms {r['health_max_ms']:>6.1f}ms"
            f"   {r['step_ms']:>8.2f} {r['forward_ms']:>10.2f} {r['non_forward_share']:>7.1%}"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "server_latency.json").write_text(json.dumps(rows, indent=2))
    print(f"wrote {RESULTS / 'server_latency.json'}")


if __name__ == "__main__":
    main()
