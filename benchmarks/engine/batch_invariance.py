"""What ``batch_invariant=True`` costs, and what it buys: engine steps off vs on, same process.

    .venv/bin/python -m benchmarks.engine.batch_invariance [--dtypes bfloat16,float32] [--batches 8,32]
                                                    [--prompt 128] [--steps 6] [--rounds 3] [--threads 2]

Per dtype, two engines on the demo model (SmolLM2-135M-Instruct; the bench-preset random model when
it is not cached) on the native CPU backend, identical but for ``batch_invariant``. Per batch size
and round each runs (alternately, the order reversed every other round):

  * prefill: ``batch`` prompts of ``--prompt`` tokens admitted at once, steps until each has its
    first token; reported as prompt tokens per CPU-second and per wall-second;
  * decode: ``--steps`` pure decode steps of the batch; output tokens per CPU-second and wall-second.

"seed holds": a seeded sampled request (temperature 1, 24 tokens) served alone and then while
``batch`` others decode beside it; "yes" when its tokens are the same (what the mode promises).
CPU seconds of this process are robust to neighbours on a shared machine; the cost column is
off ÷ on of output tokens per CPU-second (> 1: the mode is slower). JSON:
benchmarks/results/batch_invariance.json with the CPU model, kind and flags.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

from benchmarks.lib.paths import RESULTS


def _model_dir() -> str:
    from benchmarks.lib.real_text import CACHE
    from loraplex.engine.real_model import DEMO_MODEL_NAME

    test_cache = Path(os.environ.get("LORAPLEX_TEST_CACHE", Path.home() / ".cache/loraplex/test-models"))
    for demo in (CACHE / DEMO_MODEL_NAME, test_cache / DEMO_MODEL_NAME):  # converted by the benchmarks or tests
        if (demo / "config.json").is_file():
            return str(demo)
    from loraplex.engine.demo_model import create_random_checkpoint

    path = CACHE / "bench-random"
    if not (path / "config.json").is_file():
        create_random_checkpoint(path, preset="bench", seed=3)
    return str(path)


def run_steps(engine, batch: int, prompt: int, steps: int, rng: random.Random) -> dict:
    from loraplex.engine import EngineRequest, SamplingParams

    vocab = engine.model_config.vocab_size
    sp = SamplingParams(max_tokens=512, temperature=0.0, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(EngineRequest([rng.randrange(100, vocab - 1) for _ in range(prompt)], sp))
    t0, c0 = time.perf_counter(), time.process_time()
    while any(not s.in_decode for s in engine.scheduler.running) or engine.policy.num_waiting():
        engine.step()
    pre_wall, pre_cpu = time.perf_counter() - t0, time.process_time() - c0
    engine.step()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        engine.step()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    for rid in list(engine.requests):
        engine.abort_request(rid)
    return {
        "prefill_tok_per_cpu_s": batch * prompt / pre_cpu,
        "prefill_tok_per_s": batch * prompt / pre_wall,
        "decode_tok_per_cpu_s": batch * steps / cpu,
        "decode_tok_per_s": batch * steps / wall,
    }


def seed_holds(engine, batch: int, rng: random.Random) -> bool:
    from loraplex.engine import EngineRequest, SamplingParams

    vocab = engine.model_config.vocab_size
    prompt = [rng.randrange(100, vocab - 1) for _ in range(150)]
    seeded = SamplingParams(max_tokens=24, temperature=1.0, seed=7, ignore_eos=True)

    def serve(others: int) -> list[int]:
        for _ in range(others):
            n = rng.randrange(8, 300)
            params = SamplingParams(max_tokens=40, temperature=0.8, ignore_eos=True)
            engine.add_request(EngineRequest([rng.randrange(100, vocab - 1) for _ in range(n)], params))
        for _ in range(2 if others else 0):
            engine.step()
        req = engine.add_request(EngineRequest(prompt, seeded))
        tokens: list[int] = []
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id == req.request_id and out.finished:
                    tokens = out.token_ids
                    for rid in list(engine.requests):
                        engine.abort_request(rid)
        return tokens

    return serve(0) == serve(batch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    from loraplex.engine import EngineConfig, LLMEngine
    from loraplex.kernels import cpu_packed

    torch.set_num_threads(args.threads)
    kind = cpu_packed.cpu_kind()
    model = _model_dir()
    print(f"CPU: {kind.model} | kind {kind.name} | flags {' '.join(kind.flags)} | load {os.getloadavg()}")
    print(f"model: {model}; {args.threads} thread(s)")
    batches = [int(b) for b in args.batches.split(",")]
    table = []
    for dtype in args.dtypes.split(","):
        engines = {
            mode: LLMEngine(
                EngineConfig(
                    model=model,
                    dtype=dtype,
                    kernel_backend="cpu",
                    batch_invariant=(mode == "on"),
                    max_num_seqs=max(batches) + 1,
                    kv_cache_memory_gb=1.0,
                    enable_prefix_caching=False,
                )
            )
            for mode in ("off", "on")
        }
        results: dict[tuple[int, str], list[dict]] = {}
        configs = [(b, m) for b in batches for m in engines]
        for r in range(args.rounds):
            for b, m in configs if r % 2 == 0 else configs[::-1]:
                res = run_steps(engines[m], b, args.prompt, args.steps, random.Random(1000 * r + b))
                results.setdefault((b, m), []).append(res)
                print(
                    f"{dtype} round {r} b{b} {m}: " + json.dumps({k: round(v, 1) for k, v in res.items()}), flush=True
                )
        for b in batches:
            holds = {m: seed_holds(engines[m], b, random.Random(b)) for m in engines}
            med = {
                m: {k: statistics.median(x[k] for x in results[(b, m)]) for k in results[(b, m)][0]} for m in engines
            }
            for m in engines:
                cost = med["off"]["decode_tok_per_cpu_s"] / med[m]["decode_tok_per_cpu_s"]
                pcost = med["off"]["prefill_tok_per_cpu_s"] / med[m]["prefill_tok_per_cpu_s"]
                table.append(
                    {
                        "dtype": dtype,
                        "batch": b,
                        "batch_invariant": m,
                        **med[m],
                        "decode_cost": cost,
                        "prefill_cost": pcost,
                        "seed_holds": holds[m],
                    }  # fmt: skip
                )
        del engines
    print(f"\nmedians of {args.rounds} rounds; load now {os.getloadavg()}")
    head = f"{'dtype':>8} {'batch':>5} {'mode':>4} {'prefill tok/CPU-s':>17} {'decode tok/CPU-s':>16} {'decode tok/s':>12} {'prefill cost':>12} {'decode cost':>11} {'seed holds':>10}"
    print(head)
    for row in table:
        print(
            f"{row['dtype']:>8} {row['batch']:5d} {row['batch_invariant']:>4} {row['prefill_tok_per_cpu_s']:17.0f} "
            f"{row['decode_tok_per_cpu_s']:16.1f} {row['decode_tok_per_s']:12.1f} {row['prefill_cost']:11.2f}x "
            f"{row['decode_cost']:10.2f}x {'yes' if row['seed_holds'] else 'no':>10}"
        )
    out = RESULTS / "batch_invariance.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"cpu": kind.model, "kind": kind.name, "flags": list(kind.flags), "model": model, "args": vars(args),
            "load_after": os.getloadavg(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    out.write_text(json.dumps({"meta": meta, "table": table}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
