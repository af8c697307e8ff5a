"""The real demo model (SmolLM2-135M-Instruct) on this machine: the numbers a new user sees.

    .venv/bin/python -m benchmarks.engine.real_model              # batches 1 16 64, adapters, start-up
    .venv/bin/python -m benchmarks.engine.real_model --quick      # batches 1 8, fewer tokens

Rows, all in this one process on the same converted checkpoint, engine defaults otherwise
(dtype/device auto, prefix caching on):
  * base, batch B: B chat requests (chat template, outputs end at EOS, capped at --max-tokens)
    submitted together with max_num_seqs = B, ``--rounds`` times; output tok/s over the rounds,
    TTFT p50 (time from submission to the first token, prefill of the whole batch included).
  * mixed, batch B: the same requests with base / french / pirate adapters interleaved in the batch.
  * prefix cache off / on, no hits: every prompt has its own system prompt, so no full block is
    shared: what caching costs when it does not help.
  * start-up: `loraplex serve` on a FRESH data dir until /health answers (GGUF conversion included),
    then again on the same data dir (conversion reused).
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

from benchmarks.lib.real_text import QUESTIONS, chat_prompt, demo_adapters, demo_model_dir, real_arrivals
from benchmarks.lib.workload import Arrival, drive_engine, print_table, summarize, write_json
from loraplex.engine import EngineConfig, LLMEngine, SamplingParams
from tests.harness.serve import ServeProcess


def run_batches(
    model_dir: Path,
    batch: int,
    rounds: int,
    max_tokens: int,
    adapters: dict[str, str],
    mix: list[str | None],
    seed: int,
    caching: bool = True,
    unique_system: bool = False,
) -> dict:
    engine = LLMEngine(
        EngineConfig(
            model=str(model_dir), max_num_seqs=batch, enable_prefix_caching=caching, max_loras=max(1, len(adapters))
        )
    )
    for name, path in adapters.items():
        engine.lora.add_adapter(name, path)
    params = lambda a: SamplingParams(max_tokens=a.max_tokens, temperature=0.0)  # noqa: E731  (EOS ends)
    warm = real_arrivals(engine.tokenizer, 2, [0.0, 0.0], 4, seed + 99, mix)
    drive_engine(engine, warm, params)
    records, span = [], 0.0
    for r in range(rounds):
        arrivals = real_arrivals(engine.tokenizer, batch, [0.0] * batch, max_tokens, seed + r, mix)
        if unique_system:  # a fresh system prompt per request: no full KV block is shared
            rng = random.Random(seed + r)
            arrivals = [
                Arrival(
                    0.0,
                    chat_prompt(
                        engine.tokenizer,
                        rng.choice(QUESTIONS),
                        system=f"Conversation {rng.randrange(10**9)}. Be helpful.",
                    ),
                    a.max_tokens,
                    a.adapter,
                )
                for a in arrivals
            ]
        got = drive_engine(engine, arrivals, params)
        span += max(x.finish for x in got) - min(x.arrival for x in got)
        records += got
    row = summarize("", records)  # latencies: each round's times are relative to its own start
    row["output_tok_per_s"] = sum(x.output_tokens for x in records) / span  # rounds ran back to back
    row.update(
        dtype=str(engine.runner.dtype).removeprefix("torch."),
        mean_output_tokens=sum(r.output_tokens for r in records) / len(records),
        eos_share=sum(r.output_tokens < max_tokens for r in records) / len(records),
        prefix_hit_tokens=engine.kv.stats()["prefix_cache_hits"],
    )
    return row


def time_serve_start(data_dir: Path) -> float:
    """Seconds from launching `loraplex serve` (defaults only: no LORAPLEX_* settings) to /health."""
    server = ServeProcess(data_dir, None, config=None, clean_env=True)
    try:
        return server.startup_s
    finally:
        server.stop(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="*", default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-startup", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    batches = args.batches or ([1, 8] if args.quick else [1, 16, 64])
    max_tokens = 24 if args.quick else args.max_tokens
    model_dir = demo_model_dir()
    adapters = demo_adapters(model_dir)
    mix = [None, "french", "pirate"]
    rows = []
    for b in batches:
        print(f"batch {b}: base ...", flush=True)
        rows.append(
            {**run_batches(model_dir, b, args.rounds, max_tokens, {}, [None], args.seed), "system": f"base, batch {b}"}
        )
        if b > 1:
            print(f"batch {b}: base + french + pirate mixed ...", flush=True)
            rows.append(
                {
                    **run_batches(model_dir, b, args.rounds, max_tokens, adapters, mix, args.seed),
                    "system": f"base+french+pirate mixed, batch {b}",
                }
            )
    b = batches[-1] if len(batches) > 1 else batches[0]
    for caching in (False, True):
        print(f"prefix caching {'on' if caching else 'off'}, no hits, batch {b} ...", flush=True)
        rows.append(
            {
                **run_batches(model_dir, b, args.rounds, max_tokens, {}, [None], args.seed, caching, True),
                "system": f"prefix cache {'on' if caching else 'off'} (no hits), batch {b}",
            }
        )
    cols = [
        "system",
        "dtype",
        "requests",
        "output_tok_per_s",
        "ttft_p50_ms",
        "tpot_p50_ms",
        "mean_output_tokens",
        "eos_share",
        "prefix_hit_tokens",
    ]
    print()
    print_table(rows, cols)
    startup = {}
    if not args.skip_startup:
        with tempfile.TemporaryDirectory() as tmp:
            print("\nserve on a fresh data dir (converts the GGUF) ...", flush=True)
            startup["fresh_data_dir_s"] = time_serve_start(Path(tmp) / "data")
            print("serve again on the same data dir (reuses the conversion) ...", flush=True)
            startup["second_start_s"] = time_serve_start(Path(tmp) / "data")
        print(
            f"start-up to /health: fresh data dir {startup['fresh_data_dir_s']:.1f} s, "
            f"second start {startup['second_start_s']:.1f} s"
        )
    path = write_json(
        "real_model",
        {"model": str(model_dir), "max_tokens": max_tokens, "rounds": args.rounds, "results": rows, "startup": startup},
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
