"""Continuous batching vs static batching vs Hugging Face generate, on one synthetic workload.

    .venv/bin/python -m benchmarks.engine.throughput            # full run (~3 minutes on 2 cores)
    .venv/bin/python -m benchmarks.engine.throughput --quick    # smoke run

Poisson arrivals at a rate above every system's capacity, heavy-tailed output lengths (default:
bounded Pareto, most answers under 10 tokens, a few hundreds; ``--lengths bimodal``: 90% 4-16 tokens,
10% 200-400). Each system gets the same arrival stream for the same window
(``--seconds``) and is cut off at its end: throughput is the output tokens generated inside the window
(the sustained service rate under overload, not skewed by the one long request a finite run ends
on); TTFT/TPOT are over the requests that finished inside it. All systems run in this one process on
the same ~24M-parameter random Llama, one after another: compare RATIOS.

``--real``: the real demo model (SmolLM2-135M-Instruct) on real text instead: chat prompts through
its chat template, outputs that end at EOS (``--max-tokens`` caps them); loraplex continuous vs
static only (HF generate's rows assume fixed lengths).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch

from benchmarks.lib.workload import (
    Arrival,
    Record,
    drive_engine_for,
    heavy_tailed_lengths,
    pareto_lengths,
    poisson_arrivals,
    print_table,
    summarize_window,
    write_json,
)
from loraplex.engine import EngineConfig, LLMEngine, SamplingParams
from loraplex.engine.demo_model import create_random_checkpoint


def make_workload(n: int, rate: float, vocab: int, seed: int, lengths: str = "pareto") -> list[Arrival]:
    rng = random.Random(seed)
    times = poisson_arrivals(n, rate, rng)
    lengths = pareto_lengths(n, rng) if lengths == "pareto" else heavy_tailed_lengths(n, rng)
    return [
        Arrival(t, [rng.randrange(10, vocab) for _ in range(rng.randint(16, 96))], L) for t, L in zip(times, lengths)
    ]


def run_loraplex(
    model_dir: str,
    arrivals: list[Arrival],
    batching: str,
    max_batch: int,
    dtype: str,
    horizon: float,
    ignore_eos: bool = True,
) -> tuple[list[Record], int]:
    engine = LLMEngine(
        EngineConfig(
            model=model_dir,
            dtype=dtype,
            batching=batching,
            max_num_seqs=max_batch,
            max_num_batched_tokens=1024,
            block_size=16,
            kernel_backend="auto",
            scheduling_policy="fcfs",
        )
    )
    params = lambda a: SamplingParams(max_tokens=a.max_tokens, temperature=0.0, ignore_eos=ignore_eos)  # noqa: E731
    return drive_engine_for(engine, arrivals, params, horizon)


class _StepClock:
    """A StoppingCriteria that records when each generate step produced its token, and stops the
    generation once the benchmark window has closed."""

    def __init__(self, deadline: float):
        self.times: list[float] = []
        self.deadline = deadline

    def __call__(self, input_ids, scores, **kwargs):
        now = time.monotonic()
        self.times.append(now)
        return torch.full((input_ids.shape[0],), now >= self.deadline, dtype=torch.bool)


def run_hf(
    model_dir: str, arrivals: list[Arrival], batch_size: int, dtype: str, horizon: float
) -> tuple[list[Record], int]:
    """HF generate, serving requests in arrival order: one at a time (batch_size=1) or in padded
    static batches of whatever has arrived (up to batch_size), each batch run to its longest output.
    Only tokens a request asked for count (padding rows that run on for the batch's longest don't)."""
    from transformers import AutoModelForCausalLM, StoppingCriteriaList

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    pad = model.generation_config.pad_token_id or 0
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i].t)
    start = time.monotonic()
    deadline = start + horizon
    records: dict[int, Record] = {}
    tokens = 0
    pos = 0
    with torch.inference_mode():
        while pos < len(order) and time.monotonic() < deadline:
            now = time.monotonic() - start
            if arrivals[order[pos]].t > now:
                time.sleep(arrivals[order[pos]].t - now)
                now = time.monotonic() - start
            batch = [order[pos]]
            while (
                len(batch) < batch_size and pos + len(batch) < len(order) and arrivals[order[pos + len(batch)]].t <= now
            ):
                batch.append(order[pos + len(batch)])
            pos += len(batch)
            width = max(len(arrivals[i].prompt) for i in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):  # left padding, as decoder-only batched generation needs
                p = arrivals[i].prompt
                ids[row, width - len(p) :] = torch.tensor(p)
                mask[row, width - len(p) :] = 1
            longest = max(arrivals[i].max_tokens for i in batch)
            clock = _StepClock(deadline)
            model.generate(
                ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=longest,
                min_new_tokens=longest,
                pad_token_id=pad,
                stopping_criteria=StoppingCriteriaList([clock]),
            )
            in_window = sum(1 for t in clock.times if t < deadline)
            for i in batch:
                a = arrivals[i]
                tokens += min(a.max_tokens, in_window)
                if a.max_tokens <= in_window:
                    records[i] = Record(
                        a.t, clock.times[0] - start, clock.times[a.max_tokens - 1] - start, a.max_tokens, len(a.prompt)
                    )
    return [records[i] for i in sorted(records)], tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0, help="measurement window per system")
    ap.add_argument(
        "--lengths",
        choices=["pareto", "bimodal"],
        default="pareto",
        help="output lengths: bounded Pareto (alpha 1.1, 4-512) or bimodal (90%% 4-16, 10%% 200-400)",
    )
    ap.add_argument(
        "--rate",
        type=float,
        default=160.0,
        help="mean arrivals per second (Poisson); the default overloads every system, so throughput is capacity",
    )
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["float32", "bfloat16"],
        help="weights/activations dtype for EVERY system (bf16 matmuls are ~4x faster on this CPU)",
    )
    ap.add_argument("--quick", action="store_true", help="tiny model, few requests: a smoke run")
    ap.add_argument("--skip-hf-serial", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--real", action="store_true", help="SmolLM2-135M-Instruct on chat prompts, EOS-terminated")
    ap.add_argument("--max-tokens", type=int, default=256, help="--real: cap on each answer")
    args = ap.parse_args()
    if args.real:
        return main_real(args)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    preset = "demo" if args.quick else "bench"
    horizon = 8.0 if args.quick else args.seconds
    n = int(args.rate * horizon * 1.2) + 8  # enough arrivals to keep the queue non-empty all window

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(create_random_checkpoint(tmp, preset=preset, seed=0))
        vocab = LLMEngine(EngineConfig(model=model_dir, num_kv_blocks=8)).model_config.vocab_size
        arrivals = make_workload(n, args.rate, vocab, args.seed, args.lengths)
        systems = [
            (
                "loraplex continuous",
                lambda: run_loraplex(model_dir, arrivals, "continuous", args.max_batch, args.dtype, horizon),
            ),
            (
                "loraplex static",
                lambda: run_loraplex(model_dir, arrivals, "static", args.max_batch, args.dtype, horizon),
            ),
            (
                f"HF generate padded batches (<= {args.max_batch})",
                lambda: run_hf(model_dir, arrivals, args.max_batch, args.dtype, horizon),
            ),
        ]
        if not args.skip_hf_serial:
            systems.append(("HF generate one-at-a-time", lambda: run_hf(model_dir, arrivals, 1, args.dtype, horizon)))
        rows = []
        for name, fn in systems:
            print(f"running {name} for {horizon:.0f} s ...", flush=True)
            records, tokens = fn()
            rows.append(summarize_window(name, records, tokens, horizon))
    base = rows[0]["output_tok_per_s"]
    for r in rows:
        r["continuous_speedup"] = base / r["output_tok_per_s"]
    cols = [
        "system",
        "requests",
        "req_per_s",
        "output_tok_per_s",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "tpot_p50_ms",
        "tpot_p99_ms",
        "continuous_speedup",
    ]
    print()
    print_table(rows, cols)
    lengths = [a.max_tokens for a in arrivals]
    path = write_json(
        "throughput",
        {
            "workload": {
                "arrivals": n,
                "window_s": horizon,
                "rate": args.rate,
                "max_batch": args.max_batch,
                "preset": preset,
                "dtype": args.dtype,
                "lengths": args.lengths,
                "output_len_min": min(lengths),
                "output_len_max": max(lengths),
                "output_len_mean": sum(lengths) / n,
            },
            "results": rows,
        },
    )
    print(f"\nwrote {path}")


def main_real(args) -> None:
    from benchmarks.lib.real_text import demo_model_dir, real_arrivals
    from loraplex.engine.tokenizer import load_tokenizer

    horizon = 8.0 if args.quick else args.seconds
    rate = min(args.rate, 40.0)  # a 135M model: 40/s already overloads both systems here
    n = int(rate * horizon * 1.2) + 8
    model_dir = str(demo_model_dir())
    rng = random.Random(args.seed)
    arrivals = real_arrivals(load_tokenizer(model_dir), n, poisson_arrivals(n, rate, rng), args.max_tokens, args.seed)
    rows = []
    for batching in ("continuous", "static"):
        print(f"running loraplex {batching} on SmolLM2-135M-Instruct for {horizon:.0f} s ...", flush=True)
        records, tokens = run_loraplex(
            model_dir, arrivals, batching, args.max_batch, args.dtype, horizon, ignore_eos=False
        )
        rows.append(
            summarize_window(
                f"loraplex {batching} (real text)",
                records,
                tokens,
                horizon,
                {"mean_output_tokens": sum(r.output_tokens for r in records) / max(1, len(records))},
            )
        )
    cols = [
        "system",
        "requests",
        "req_per_s",
        "output_tok_per_s",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "tpot_p50_ms",
        "mean_output_tokens",
    ]
    print()
    print_table(rows, cols)
    path = write_json(
        "throughput_real",
        {
            "workload": {
                "model": model_dir,
                "arrivals": n,
                "rate": rate,
                "window_s": horizon,
                "max_batch": args.max_batch,
                "dtype": args.dtype,
                "max_tokens": args.max_tokens,
            },
            "results": rows,
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
