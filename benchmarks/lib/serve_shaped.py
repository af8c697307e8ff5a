"""Serving-shaped traffic through one in-process engine: ``concurrency`` clients each send a random
128-token prompt (or ``prompt_len``) and read 64 greedy tokens (ignore_eos), a new prompt as soon as one ends,
``2 x concurrency`` requests in all -- the shape of ``vllm bench serve`` at that concurrency (at 64
clients ~2 new prompts join every decode step). Shared by the engine A/B benchmarks that swap one
``KernelOps`` field between runs (benchmarks/engine/prompt_attention.py, sgmv_prompt_groups.py),
through ``alternating``."""

from __future__ import annotations

import random
import statistics
import time


def serve_shaped(
    llm, concurrency: int, ops, seed: int, adapters: list[str] | None = None, prompt_len: int = 128
) -> dict:
    """Runs the traffic on ``llm`` with ``ops`` as the model's kernels; request i names
    ``adapters[i % len(adapters)]`` (None: the base model). Every call must pass its own ``seed``
    (a repeated prompt would be a prefix-cache hit, no prefill)."""
    from loraplex.engine import SamplingParams
    from loraplex.engine.request import EngineRequest

    eng = llm.engine
    eng.runner.ops = ops
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    total, sent, done = 2 * concurrency, 0, 0
    prompt_step_ms: list[float] = []
    t0, c0 = time.perf_counter(), time.process_time()
    while done < total:
        while sent < total and sent - done < concurrency:
            adapter = adapters[sent % len(adapters)] if adapters else None
            eng.add_request(
                EngineRequest([rng.randrange(100, 20000) for _ in range(prompt_len)], params, adapter=adapter)
            )
            sent += 1
        prompts = eng.policy.num_waiting() + sum(1 for s in eng.scheduler.running if not s.in_decode)
        s0 = time.perf_counter()
        outs = eng.step()
        if prompts:
            prompt_step_ms.append(1e3 * (time.perf_counter() - s0))
        for o in outs:
            done += bool(o.finished)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    generated = 64 * total
    return {
        "tok_s": generated / wall,
        "tok_per_cpu_s": generated / cpu,
        "prompt_step_ms": statistics.mean(prompt_step_ms) if prompt_step_ms else 0.0,
        "prompt_steps": len(prompt_step_ms),
    }


def alternating(
    llm,
    variants: dict,
    concurrency: int,
    rounds: int,
    seed: int,
    adapters: list[str] | None = None,
    prompt_len: int = 128,
) -> dict:
    """``rounds`` rounds of ``serve_shaped`` under each of ``variants`` (name -> KernelOps), the
    order reversed every other round, prompts of their own for every run (derived from ``seed``):
    per variant the medians of tok/s, tok per CPU-second and prompt-step ms, and the rounds' tok/s."""
    names = list(variants)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for rnd in range(rounds):
        for name in names if rnd % 2 == 0 else names[::-1]:
            run_seed = seed + 1000 * rnd + 7 * names.index(name)
            runs[name].append(
                serve_shaped(llm, concurrency, variants[name], seed=run_seed, adapters=adapters, prompt_len=prompt_len)
            )
    row: dict = {}
    for name, rs in runs.items():
        row[name] = {k: statistics.median(r[k] for r in rs) for k in ("tok_s", "tok_per_cpu_s", "prompt_step_ms")}
        row[name]["per_round_tok_s"] = [r["tok_s"] for r in rs]
    return row
