"""Automatic prefix caching: throughput and TTFT with caching on vs off, in one process.

    .venv/bin/python -m benchmarks.engine.prefix_cache            # full run (minutes on 2 busy cores)
    .venv/bin/python -m benchmarks.engine.prefix_cache --quick    # smoke run

Workload: several "applications", each a long system prompt served under its own LoRA adapter
(app 0 under the base model) and its own cache salt (its tenant); every request is one app's
system prompt plus a short user turn, so >= 80% of all prompt tokens are shared within an app.
All requests arrive at t=0 (saturation), in random app order. The cache starts cold: each app's
first request pays the full prefill; a warm-up on unrelated prompts runs before each system.
Systems: loraplex with enable_prefix_caching off, then on; same engine settings otherwise, on the
~24M "bench" model. Greedy outputs of both systems must be identical (checked).

``--real``: SmolLM2-135M-Instruct on real text: each app's system prompt is written English
rendered through the chat template with a real user question, apps 1 and 2 run under the french and
pirate demo adapters, answers end at EOS (``--output-tokens`` caps them).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.lib.adapters import write_peft_adapter
from benchmarks.lib.workload import Arrival, drive_engine, print_table, summarize, write_json
from loraplex.engine import EngineConfig, LLMEngine, SamplingParams
from loraplex.engine.demo_model import create_random_checkpoint


def make_workload(args, vocab: int) -> tuple[list[Arrival], dict]:
    rng = random.Random(args.seed)
    systems = [[rng.randrange(10, vocab) for _ in range(args.system_tokens)] for _ in range(args.apps)]
    arrivals = []
    for i in range(args.requests):
        app = rng.randrange(args.apps) if i >= args.apps else i  # every app appears early on
        user = [rng.randrange(10, vocab) for _ in range(rng.randint(*args.user_tokens))]
        adapter = None if app == 0 or args.no_adapters else f"app{app}"
        arrivals.append(Arrival(0.0, systems[app] + user, args.output_tokens, adapter, tenant=f"tenant{app}"))
    shared = sum(args.system_tokens for _ in arrivals)
    total = sum(len(a.prompt) for a in arrivals)
    return arrivals, {"shared_prompt_fraction": shared / total, "prompt_tokens": total}


APP_SYSTEM_PROMPTS = [
    (
        "You are the help desk of a public library. Opening hours are nine to six on weekdays and ten to four on "
        "Saturdays; the library is closed on Sundays and public holidays. Members may borrow up to eight books for "
        "three weeks and renew them twice online unless another member has reserved them. Late returns cost ten "
        "cents a day per item. Study rooms can be booked for two hours at a time. Be friendly and brief."
    ),
    (
        "You are the assistant of a small bakery. We bake sourdough, rye and spelt loaves every morning, croissants "
        "on weekends, and cakes to order with three days' notice. Everything is made with organic flour; we do not "
        "offer gluten-free bread because our kitchen is full of flour dust. Orders can be collected from seven in "
        "the morning. Answer questions about our products politely and in a few sentences."
    ),
    (
        "You are a travel guide for a coastal town. The old harbour has fish restaurants and boat trips to the "
        "lighthouse island every hour in summer. The museum of the sea opens at ten and is free on the first Sunday "
        "of the month. Trains to the city leave every thirty minutes from the station north of the market square. "
        "Give short, practical answers to visitors."
    ),
]


def make_real_workload(args, tokenizer, adapters: dict[str, str]) -> tuple[list[Arrival], dict]:
    from benchmarks.lib.real_text import QUESTIONS, chat_prompt

    rng = random.Random(args.seed)
    names = [None, *adapters]
    apps = len(APP_SYSTEM_PROMPTS)
    arrivals, shared = [], 0
    # The tokens every request of an app shares: the common prefix of two different questions.
    probes = [
        (chat_prompt(tokenizer, "a", system=s), chat_prompt(tokenizer, "b", system=s)) for s in APP_SYSTEM_PROMPTS
    ]
    prefix_len = [next(i for i, (x, y) in enumerate(zip(p, q)) if x != y) for p, q in probes]
    for i in range(args.requests):
        app = rng.randrange(apps) if i >= apps else i
        prompt = chat_prompt(tokenizer, rng.choice(QUESTIONS), system=APP_SYSTEM_PROMPTS[app])
        shared += prefix_len[app]
        arrivals.append(Arrival(0.0, prompt, args.output_tokens, names[app % len(names)], tenant=f"tenant{app}"))
    total = sum(len(a.prompt) for a in arrivals)
    return arrivals, {"shared_prompt_fraction": shared / total, "prompt_tokens": total}


def run(model_dir: str, adapters: dict[str, str], arrivals: list[Arrival], caching: bool, args):
    engine = LLMEngine(
        EngineConfig(
            model=model_dir,
            dtype="float32",
            kernel_backend="torch",
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            block_size=16,
            max_loras=max(1, len(adapters)),
            max_cpu_loras=max(1, len(adapters)),
            max_lora_rank=16,
            enable_prefix_caching=caching,
            kv_cache_memory_gb=1.0,
        )
    )
    for name, path in adapters.items():
        engine.lora.add_adapter(name, path)
    salt_of = {a.tenant: a.tenant for a in arrivals}  # what the platform does: one salt per tenant
    add, ids = engine.add_request, itertools.count()

    def add_request(prompt, params, **kw):  # stable ids, so both systems' outputs line up
        return add(prompt, params, request_id=f"{next(ids):05d}", cache_salt=salt_of.get(kw.get("tenant_id")), **kw)

    engine.add_request = add_request
    params = lambda a: SamplingParams(max_tokens=a.max_tokens, temperature=0.0, ignore_eos=not args.real)  # noqa: E731
    rng = random.Random(99)
    vocab = engine.model_config.vocab_size
    warm = [Arrival(0.0, [rng.randrange(10, vocab) for _ in range(64)], 4, a, "warmup") for a in [None, *adapters]]
    drive_engine(engine, warm, params)  # allocator, adapter slots; shares no prefix with the run
    outputs: dict[str, list[int]] = {}
    orig_step = engine.step

    def step():
        outs = orig_step()
        for o in outs:
            if o.finished:
                outputs[o.request_id] = o.token_ids
        return outs

    engine.step = step
    t0, c0 = time.perf_counter(), time.process_time()
    records = drive_engine(engine, arrivals, params)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    kv = engine.stats()["kv_cache"]
    extra = {
        "prefix_caching": caching,
        "wall_s": wall,
        "cpu_s": cpu,
        "hit_rate": kv["prefix_cache_hit_rate"],
        "hit_tokens": kv["prefix_cache_hits"],
        "query_tokens": kv["prefix_cache_queries"],
        "cached_blocks": kv["cached_blocks"],
        "evictions": kv["prefix_cache_evictions"],
        "steps": engine.counters["steps"],
    }
    return records, extra, outputs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2, help="off/on pairs; the best of each is reported")
    ap.add_argument("--apps", type=int, default=4, help="distinct system prompts (one adapter + tenant each)")
    ap.add_argument("--system-tokens", type=int, default=384)
    ap.add_argument("--user-tokens", type=int, nargs=2, default=(24, 72))
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--no-adapters", action="store_true", help="every app on the base model")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--real", action="store_true", help="SmolLM2-135M-Instruct, real system prompts, demo adapters")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.system_tokens, args.output_tokens, args.rounds = 12, 192, 4, 1
        args.user_tokens = (8, 24)

    if args.real:
        args.output_tokens = max(args.output_tokens, 48)
        args.apps = len(APP_SYSTEM_PROMPTS)
    with tempfile.TemporaryDirectory() as tmp:
        if args.real:
            from benchmarks.lib.real_text import demo_adapters, demo_model_dir
            from loraplex.engine.tokenizer import load_tokenizer

            model_dir = str(demo_model_dir())
            adapters = {} if args.no_adapters else demo_adapters(Path(model_dir))
            arrivals, info = make_real_workload(args, load_tokenizer(model_dir), adapters)
        else:
            model_dir = str(Path(tmp) / "bench")
            create_random_checkpoint(model_dir, preset="bench", seed=0)
            cfg = json.loads((Path(model_dir) / "config.json").read_text())
            adapters = (
                {}
                if args.no_adapters
                else {
                    f"app{i}": write_peft_adapter(Path(tmp) / f"app{i}", model_dir, cfg, rank=16, seed=i)
                    for i in range(1, args.apps)
                }
            )
            arrivals, info = make_workload(args, cfg["vocab_size"])
        # Rounds alternate off/on so that a noisy neighbour hits both alike; each system's best
        # (shortest) round goes in the table, every round in the JSON.
        rounds, outs = [], {}
        for r in range(args.rounds):
            for caching in (False, True):
                name = "caching-on" if caching else "caching-off"
                records, extra, outs[(caching, r)] = run(model_dir, adapters, arrivals, caching, args)
                rounds.append(summarize(name, records, {"round": r, **extra}))
    identical = all(o == outs[(False, 0)] for o in outs.values())
    off, on = (
        min((x for x in rounds if x["system"] == name), key=lambda x: x["duration_s"])
        for name in ("caching-off", "caching-on")
    )
    rows = [off, on]
    speedup = {
        "throughput_x": on["output_tok_per_s"] / off["output_tok_per_s"],
        "req_per_s_x": on["req_per_s"] / off["req_per_s"],
        "mean_ttft_x_lower": off["ttft_mean_ms"] / on["ttft_mean_ms"],
    }
    print(
        f"{args.requests} requests, {args.apps} apps ({len(adapters)} LoRA adapters + base), "
        f"system prompt {args.system_tokens} tokens, {info['shared_prompt_fraction']:.0%} of "
        f"{info['prompt_tokens']} prompt tokens shared, {args.output_tokens} output tokens each"
    )
    print_table(
        rows,
        [
            "system",
            "req_per_s",
            "output_tok_per_s",
            "ttft_mean_ms",
            "ttft_p50_ms",
            "ttft_p99_ms",
            "tpot_p50_ms",
            "hit_rate",
            "duration_s",
            "cpu_s",
        ],
    )
    print(
        f"throughput x{speedup['throughput_x']:.2f}, mean TTFT {speedup['mean_ttft_x_lower']:.2f}x lower; "
        f"greedy outputs identical: {identical}"
    )
    path = write_json(
        "prefix_cache_real" if args.real else "prefix_cache",
        {
            "args": vars(args),
            "workload": info,
            "adapters": len(adapters),
            "results": rows,
            "rounds": rounds,
            "speedup": speedup,
            "outputs_identical": identical,
        },
    )
    print(f"wrote {path}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
