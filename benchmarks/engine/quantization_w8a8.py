"""W8A8 (``quantization="w8a8"``: int8 weights AND per-token int8 activations) against bf16 (the
default packed path) and INT8 weight-only, on the REAL demo model (SmolLM2-135M-Instruct, already
converted in the test cache: nothing downloads), bf16 activations, native CPU kernels:

    .venv/bin/python -m loraplex.engine.runtime_env -m benchmarks.engine.quantization_w8a8           # ~8 min, 2 cores
    .venv/bin/python -m loraplex.engine.runtime_env -m benchmarks.engine.quantization_w8a8 --quick   # smoke run

Per configuration: weight bytes (parameters + persistent buffers + packed copies), the process RSS
growth while the engine was built (loaded in float32 first for the int8 ones: freed pages the
allocator keeps count), perplexity of benchmarks/data/perplexity_text.txt (prompt logprobs),
greedy agreement with bf16 over the chat questions of benchmarks/lib/real_text.py (whole outputs
identical, mean leading tokens equal), decode CPU ms per step at batch 1/16/64 (process CPU time of
``max_tokens = 1 + D`` minus ``max_tokens = 1``, over D steps), and prefill CPU ms of 16 prompts x
128 tokens (one 2048-token step). All three engines live in one process and the timings alternate
between them round by round (best of the rounds per configuration): on a shared 2-core machine
CPU time, not wall time, and ratios, not absolute numbers. Prefix caching is off (the rounds repeat
prompts). The CPU model, flags and load averages go into the table's header and the JSON.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import resource
import time
from pathlib import Path

import torch

from benchmarks.lib.cpu_result import write_cpu_result
from benchmarks.lib.real_text import QUESTIONS, chat_prompt, demo_model_dir
from benchmarks.lib.workload import print_table
from loraplex.engine import LLM, SamplingParams
from loraplex.engine.models.quantization import weight_bytes
from loraplex.kernels.cpu_packed import cpu_kind

TEXT = Path(__file__).resolve().parents[1] / "data" / "perplexity_text.txt"
CONFIGS = [
    ("bf16", None),
    ("int8 (weight-only)", "int8"),
    ("w8a8", "w8a8"),
    ("w8a8, weight-only head (experiment)", "w8a8"),
]
# The last one is not an engine option: the w8a8 model with its head's matmul swapped for INT8's
# weight-only one after load (float activations into the head), to measure the head choice of
# engine/models/quantization.py (the head's activations quantized per token too).


def _rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


def _perplexity(llm: LLM, tokens: list[int]) -> float:
    out = llm.generate([tokens], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0))[0]
    lps = [entry.logprob for entry in out.prompt_logprobs if entry is not None]
    return math.exp(-sum(lps) / len(lps))


def _cpu_ms(llm: LLM, prompts: list[list[int]], max_tokens: int) -> float:
    params = SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    t = time.process_time()
    llm.generate(prompts, params)
    return (time.process_time() - t) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="quantization_w8a8")
    args = ap.parse_args()
    load_start = os.getloadavg()
    model_dir = demo_model_dir()
    n_q, n_tok, steps = (4, 12, 4) if args.quick else (len(QUESTIONS), 32, 16)
    batches = (1, 16) if args.quick else (1, 16, 64)
    rounds = 1 if args.quick else args.rounds
    llms: dict[str, LLM] = {}
    rows: dict[str, dict] = {}
    reference: list[list[int]] = []
    for name, quant in CONFIGS:
        gc.collect()
        before = _rss_mb()
        llm = LLM(
            model=str(model_dir), dtype="bfloat16", quantization=quant, kernel_backend="cpu",
            enable_prefix_caching=False, max_num_seqs=64,
        )  # fmt: skip
        llms[name] = llm
        if "head" in name:
            llm.engine.runner.model.quantized_head.int8_linear = llm.engine.runner.ops.int8_linear
        tok = llm.engine.tokenizer
        text = tok.encode(TEXT.read_text())[: 128 if args.quick else 512]
        prompts = [chat_prompt(tok, q) for q in QUESTIONS[:n_q]]
        got = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=n_tok, temperature=0.0))]
        reference = reference or got
        lead = [
            next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), min(len(g), len(r)))
            for g, r in zip(got, reference)
        ]
        rows[name] = {
            "config": name,
            "weight_MiB": round(weight_bytes(llm.engine.runner.model) / 2**20, 1),
            "rss_growth_MiB": round(_rss_mb() - before, 1),
            "perplexity": round(_perplexity(llm, text), 3),
            "greedy_identical": f"{sum(g == r for g, r in zip(got, reference))}/{len(got)}",
            "mean_leading_equal": round(sum(lead) / len(lead), 1),
        }
        print(rows[name], flush=True)
    tok = llms["bf16"].engine.tokenizer
    chat = [chat_prompt(tok, q) for q in QUESTIONS]
    words = tok.encode(TEXT.read_text())
    words = words * (1 + 16 * 37 // len(words))
    prefill_prompts = [words[i * 37 : i * 37 + 128] for i in range(16)]  # 16 distinct 128-token prompts
    timings: dict[str, dict[str, list[float]]] = {name: {} for name in llms}
    for r in range(rounds + 1):  # round 0 warms every engine's kernels and pages, not recorded
        for name, llm in llms.items():
            for b in batches:
                prompts = (chat * 8)[:b]
                decode = (_cpu_ms(llm, prompts, 1 + steps) - _cpu_ms(llm, prompts, 1)) / steps
                if r:
                    timings[name].setdefault(f"decode_cpu_ms_b{b}", []).append(decode)
            prefill = _cpu_ms(llm, prefill_prompts, 1)
            if r:
                timings[name].setdefault("prefill_cpu_ms_16x128", []).append(prefill)
        print(f"round {r} done, load {os.getloadavg()}", flush=True)
    for name, cols in timings.items():
        for col, values in cols.items():
            rows[name][col] = round(min(values), 2)
    kind = cpu_kind()
    load_end = os.getloadavg()
    print(
        f"CPU: {kind.model} (kind {kind.name}, flags {' '.join(kind.flags)}), torch threads "
        f"{torch.get_num_threads()}; load average at start {load_start}, at end {load_end}"
    )
    table = list(rows.values())
    print_table(table, list(table[0]))
    meta = {"load_start": load_start, "torch_threads": torch.get_num_threads(), "rounds": rounds, "steps": steps}
    print(write_cpu_result(args.out, meta, rows=table))


if __name__ == "__main__":
    main()
