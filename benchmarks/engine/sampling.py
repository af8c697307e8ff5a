"""Sampler cost per step for a batch of 64, against the cost of the decode step it follows.

    .venv/bin/python -m benchmarks.engine.sampling             # vocab 704 (the bench model's) and 32000
    .venv/bin/python -m benchmarks.engine.sampling --quick

Configurations (each row of the batch has its own SamplingParams and token history: a 32-token
prompt and 64 generated tokens):
  (a) greedy        : temperature 0 everywhere
  (b) mixed         : 64 different parameter sets (presence/frequency/repetition penalties,
                      top-k, top-p, min-p, temperatures, logit_bias, half of the rows seeded)
  (c) 50% json      : half the rows constrained to a JSON schema (xgrammar matchers: bitmask fill,
                      masked sampling, matcher advance), the other half greedy
The denominator is a full greedy ``LLMEngine.step()`` of 64 decoding sequences on the ~25M
"bench" model (forward + sampling + bookkeeping) with the same vocabulary.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.lib.workload import print_table, write_json
from loraplex.engine import EngineConfig, LLMEngine, SamplingParams
from loraplex.engine.demo_model import create_random_checkpoint
from loraplex.engine.sampler import sample_batch
from loraplex.engine.sampling_params import StructuredOutputSpec
from loraplex.engine.sequence import Request, Sequence

BATCH = 64
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}


def decode_step_ms(model_dir: str, steps: int) -> float:
    engine = LLMEngine(
        EngineConfig(
            model=model_dir, max_num_seqs=BATCH, max_num_batched_tokens=4096, num_kv_blocks=BATCH * 16, block_size=16
        )
    )
    rng = random.Random(0)
    for _ in range(BATCH):
        engine.add_request(
            [rng.randrange(5, 600) for _ in range(32)],
            SamplingParams(max_tokens=steps + 20, temperature=0.0, ignore_eos=True),
        )
    engine.step()  # prefill of all 64
    for _ in range(3):
        engine.step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000, engine


def mixed_params(rng: random.Random, vocab: int) -> SamplingParams:
    return SamplingParams(
        temperature=rng.choice([0.0, 0.5, 0.8, 1.0, 1.3]),
        top_k=rng.choice([-1, 5, 40, 200]),
        top_p=rng.choice([1.0, 0.95, 0.8, 0.5]),
        min_p=rng.choice([0.0, 0.02, 0.1]),
        presence_penalty=rng.choice([0.0, 0.5, 1.0]),
        frequency_penalty=rng.choice([0.0, 0.3, 1.2]),
        repetition_penalty=rng.choice([1.0, 1.1, 1.3]),
        logit_bias={rng.randrange(vocab): rng.choice([-5.0, 5.0])} if rng.random() < 0.3 else {},
        seed=rng.randrange(1000) if rng.random() < 0.5 else None,
        max_tokens=1000,
    )


def make_seqs(params: list[SamplingParams], rng: random.Random, vocab: int) -> list[Sequence]:
    seqs = []
    for i, p in enumerate(params):
        prompt = [rng.randrange(vocab) for _ in range(32)]
        req = Request(f"r{i}", prompt, p)
        seq = Sequence(
            request=req, index=0, token_ids=prompt + [rng.randrange(vocab) for _ in range(64)], num_prompt_tokens=32
        )
        if p.seed is not None:
            seq.generator = torch.Generator().manual_seed(p.seed)
        seqs.append(seq)
    return seqs


def time_sampler(engine: LLMEngine, seqs: list[Sequence], vocab: int, iters: int, constrained: bool) -> float:
    so = engine.structured
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(len(seqs), vocab) * 4
    grammar = so.compile(StructuredOutputSpec.json_schema(SCHEMA)) if constrained else None
    if grammar is not None:
        so.add_sequences([s for s in seqs if s.request.params.structured_output is not None], grammar)
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        bitmask = so.bitmask_for(seqs) if so.active else None
        out = sample_batch(logits, seqs, gen, bitmask)
        for s, tok in zip(seqs, out.tokens):
            if so.accept(s, tok):  # grammar complete: start the next object
                so.release(s)
                so.add_sequences([s], grammar)
        times.append(time.perf_counter() - t)
    for s in seqs:
        so.release(s)
    return statistics.median(times) * 1000


def run(vocab: int, steps: int, iters: int, root: Path) -> list[dict]:
    model = str(create_random_checkpoint(root / f"bench-v{vocab}", preset="bench", seed=0, vocab_size=vocab))
    step_ms, engine = decode_step_ms(model, steps)
    rng = random.Random(1)
    configs = {
        "(a) greedy": ([SamplingParams(temperature=0.0, max_tokens=1000) for _ in range(BATCH)], False),
        "(b) mixed": ([mixed_params(rng, vocab) for _ in range(BATCH)], False),
        "(c) 50% json": (
            [
                SamplingParams(
                    temperature=0.7, max_tokens=1000, structured_output=StructuredOutputSpec.json_schema(SCHEMA)
                )
                if i % 2 == 0
                else SamplingParams(temperature=0.0, max_tokens=1000)
                for i in range(BATCH)
            ],
            True,
        ),
    }
    rows, base = [], None
    for name, (params, constrained) in configs.items():
        ms = time_sampler(engine, make_seqs(params, random.Random(2), vocab), vocab, iters, constrained)
        base = ms if base is None else base
        rows.append(
            {
                "vocab": vocab,
                "config": name,
                "sampler_ms": ms,
                "decode_step_ms": step_ms,
                "overhead_vs_greedy_ms": ms - base,
                "overhead_pct_of_step": 100 * (ms - base) / step_ms,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--vocab", type=int, nargs="*", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    vocabs = args.vocab or ([704] if args.quick else [704, 32000])
    steps, iters = (5, 10) if args.quick else (20, 50)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for v in vocabs:
            rows += run(v, steps, iters, Path(tmp))
    print_table(
        rows, ["vocab", "config", "sampler_ms", "decode_step_ms", "overhead_vs_greedy_ms", "overhead_pct_of_step"]
    )
    print("targets: (b) <= 10% and (c) <= 25% of a decode step")
    print("wrote", write_json("sampling", {"batch": BATCH, "torch_threads": 1, "rows": rows}))


if __name__ == "__main__":
    main()
