"""Plain decoding vs speculative decoding (n-gram prompt lookup, draft model), batch 1 / 8 / 32.

    .venv/bin/python -m benchmarks.engine.speculative             # ~3-4 minutes on 2 cores
    .venv/bin/python -m benchmarks.engine.speculative --quick     # smoke run
    .venv/bin/python -m benchmarks.engine.speculative --model DIR # a real checkpoint as the target

Two workloads: "repetitive" (prompts made of spans that recur, the shape of editing / summarising
text that copies its input) and "free-form" (random prompts). Systems: plain; ngram; draft = a
smaller random model with the target's tokenizer (acceptance near chance: the lower bound);
draft = the target itself (every proposal accepted: the upper bound on what verification buys, at
the price of running the target twice). Greedy, every request decodes ``--tokens`` tokens.
Reported: output tok/s (wall time of the whole generate, prefill included; ``--cpu-time``: process
CPU time instead), acceptance rate, mean
tokens per verification, target forward steps per output token (1.0 for plain decoding at batch 1;
lower is what speculation buys), and whether the outputs equal plain decoding's.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.lib.workload import print_table, write_json
from loraplex.engine import LLM, SamplingParams
from loraplex.engine.demo_model import create_random_checkpoint


def prompts_for(kind: str, n: int, vocab: int, rng: random.Random) -> list[list[int]]:
    out = []
    for _ in range(n):
        if kind == "repetitive":
            spans = [[rng.randrange(10, vocab) for _ in range(rng.randint(4, 10))] for _ in range(3)]
            text: list[int] = []
            while len(text) < 64:
                text.extend(rng.choice(spans))
            out.append(text[:64])
        else:
            out.append([rng.randrange(10, vocab) for _ in range(64)])
    return out


CLOCK = time.perf_counter  # --cpu-time: process CPU time, steadier than wall time on a shared machine


def run(
    model: str, prompts: list[list[int]], tokens: int, dtype: str, adapters: dict[str, str] | None = None, **spec
) -> tuple[dict, list]:
    adapters = adapters or {}
    llm = LLM(
        model=model,
        dtype=dtype,
        kernel_backend="torch",
        max_num_seqs=32,
        max_num_batched_tokens=2048,
        scheduling_policy="fcfs",
        max_loras=max(1, len(adapters)),
        max_cpu_loras=max(1, len(adapters)),
        max_lora_rank=16,
        **spec,
    )
    for name, path in adapters.items():
        llm.add_adapter(name, path)
    names = [None, *adapters]  # rows cycle through the base model and every adapter
    which = [names[i % len(names)] for i in range(len(prompts))]
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))  # warm-up
    steps0, gen0 = llm.engine.counters["steps"], llm.engine.counters["generated_tokens"]
    t = CLOCK()
    outs = llm.generate(prompts, params, adapters=which)
    wall = CLOCK() - t
    steps = llm.engine.counters["steps"] - steps0
    generated = llm.engine.counters["generated_tokens"] - gen0
    st = llm.engine.stats()["speculative"] or {}
    return {
        "tok/s": generated / wall,
        "acceptance": st.get("acceptance_rate"),
        "tokens/verify": st.get("mean_accepted_length"),
        "steps/token": steps * len(prompts) / generated,
        "target steps": steps,
        "proposed": st.get("proposed_tokens", 0),
        "draft rows": st.get("draft_rows", 0),
        "ngram rows": st.get("ngram_rows", 0),
    }, [o.outputs[0].token_ids for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--model", default=None, help="target checkpoint (default: a random bench-preset Llama)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--preset", default=None, help="random target preset: bench (default) or demo")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,8,32)")
    ap.add_argument("--cpu-time", action="store_true", help="time with process CPU time instead of wall time")
    ap.add_argument("--adapters", type=int, default=8, help="adapters in the adapter-mixed workload (0: skip it)")
    ap.add_argument("--systems", default=None, help="comma-separated name prefixes to run (default: all)")
    ap.add_argument("--workloads", default=None, help="comma-separated name prefixes to run (default: all)")
    args = ap.parse_args()
    global CLOCK
    if args.cpu_time:
        CLOCK = time.process_time
    torch.manual_seed(0)
    batches = [1, 8] if args.quick else [1, 8, 32]
    if args.batches:
        batches = [int(b) for b in args.batches.split(",")]
    tokens = 12 if args.quick else args.tokens
    preset = args.preset or ("demo" if args.quick else "bench")
    with tempfile.TemporaryDirectory() as tmp:
        target = args.model or str(
            create_random_checkpoint(Path(tmp) / "target", preset=preset, seed=3, initializer_range=0.05)
        )
        # A draft with the target's tokenizer and a quarter of its width and depth.
        from loraplex.engine.models import ModelConfig

        mc = ModelConfig.from_dir(target)
        draft = str(
            create_random_checkpoint(
                Path(tmp) / "draft",
                preset="demo",
                seed=5,
                vocab_size=mc.vocab_size,
                hidden_size=max(64, mc.hidden_size // 4),
                intermediate_size=max(128, mc.intermediate_size // 4),
                num_hidden_layers=max(1, mc.num_layers // 4),
                num_attention_heads=4,
                num_key_value_heads=2,
                initializer_range=0.05,
            )
        )
        systems = [
            ("plain", {}),
            ("ngram", {"speculative_method": "ngram", "num_speculative_tokens": args.k}),
            (
                "draft (small random)",
                {"speculative_method": "draft", "draft_model": draft, "num_speculative_tokens": args.k},
            ),
            (
                "draft = target",
                {
                    "speculative_method": "draft",
                    "draft_model": target,
                    "num_speculative_tokens": args.k,
                    "speculative_adaptive": False,
                },
            ),
        ]
        systems.append(
            (
                f"self-spec ({max(1, mc.num_layers // 2)} of {mc.num_layers} layers)",
                {
                    "speculative_method": "draft",
                    "draft_model": target,
                    "draft_num_layers": max(1, mc.num_layers // 2),
                    "num_speculative_tokens": args.k,
                },
            )
        )
        if args.systems:  # plain always runs: the other rows are compared with it
            want = args.systems.split(",")
            systems = [s for s in systems if s[0] == "plain" or any(s[0].startswith(w) for w in want if w)]
        adapters: dict[str, str] = {}
        workloads = ["repetitive", "free-form"]
        if args.adapters:
            from benchmarks.lib.peer_adapters import make_adapters

            adapters = make_adapters(target, args.adapters)
            workloads.append(f"free-form, {args.adapters} adapters + base mixed")
        if args.workloads:
            workloads = [w for w in workloads if any(w.startswith(x) for x in args.workloads.split(",") if x)]
        rows = []
        for kind in workloads:
            rng = random.Random(1)
            mixed = kind.endswith("mixed")
            all_prompts = prompts_for("free-form" if mixed else kind, max(batches), min(mc.vocab_size, 50000), rng)
            for b in batches:
                prompts = all_prompts[:b]
                plain_out = plain_steps = None
                for name, spec in systems:
                    res, outs = run(target, prompts, tokens, args.dtype, adapters if mixed else None, **spec)
                    if plain_out is None:
                        plain_out, plain_steps = outs, res["target steps"]
                    res["steps vs plain"] = plain_steps / res["target steps"]
                    rows.append({"workload": kind, "batch": b, "system": name, **res, "= plain": outs == plain_out})
                    print(rows[-1], flush=True)
        cols = [
            "workload",
            "batch",
            "system",
            "tok/s",
            "acceptance",
            "tokens/verify",
            "target steps",
            "steps vs plain",
            "draft rows",
            "ngram rows",
            "= plain",
        ]
        print(
            f"\ntarget {'random ' + preset if not args.model else args.model}, k={args.k}, {tokens} tokens, "
            f"{args.dtype}, {torch.get_num_threads()} threads"
        )
        print_table(rows, cols)
        path = write_json("speculative", {"k": args.k, "tokens": tokens, "rows": rows})
        print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
