"""INT4 weight-only (group-wise, ``quantization="int4"``) against fp32 and INT8, on the REAL demo model
(SmolLM2-135M-Instruct): what each costs in quality and what it saves in memory, on this CPU.

    .venv/bin/python -m benchmarks.engine.quantization_int4             # ~3-5 minutes on 2 cores
    .venv/bin/python -m benchmarks.engine.quantization_int4 --quick     # smoke run
    .venv/bin/python -m benchmarks.engine.quantization_int4 --bf16      # + bf16 activations (~+50%)

Per configuration (fp32 activations unless named bf16; native CPU kernels; one process, one after another):
weight bytes (parameters + persistent buffers), perplexity of benchmarks/data/perplexity_text.txt
(prompt logprobs: every token given the ones before it), greedy agreement with the fp32 model over
chat questions (whole outputs identical, and mean leading tokens equal), and decode output tokens
per wall second and per process-CPU second at batch 1 and 16 (steady state, prefill excluded; on a
shared machine compare the ratios, and the load averages printed with the table). The CPU model and flags go into the JSON.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
from pathlib import Path

import torch

from benchmarks.lib.real_text import QUESTIONS, chat_prompt, demo_model_dir
from benchmarks.lib.workload import print_table, write_json
from loraplex.engine import LLM, SamplingParams
from loraplex.engine.models.quantization import weight_bytes
from loraplex.kernels.cpu_packed import cpu_kind

TEXT = Path(__file__).resolve().parents[1] / "data" / "perplexity_text.txt"
CONFIGS = [  # name, quantization, group size, activation dtype
    ("fp32", None, None, "float32"),
    ("int8", "int8", None, "float32"),
    ("int4 g128", "int4", 128, "float32"),
    ("int4 g64", "int4", 64, "float32"),
    ("int4 g32", "int4", 32, "float32"),
]
# --bf16: the same with bf16 activations (on AVX512-BF16 CPUs the dense GEMMs run in bf16; the int4
# decode kernel still computes in float32, converting the activations in and out).
BF16_CONFIGS = [
    ("bf16", None, None, "bfloat16"),
    ("int8 bf16", "int8", None, "bfloat16"),
    ("int4 g128 bf16", "int4", 128, "bfloat16"),
]


def _llm(model_dir: Path, quantization: str | None, group: int | None, dtype: str) -> LLM:
    extra = {"quantization_group_size": group} if group else {}
    return LLM(model=str(model_dir), dtype=dtype, quantization=quantization, kernel_backend="cpu", **extra)


def _perplexity(llm: LLM, tokens: list[int]) -> float:
    out = llm.generate([tokens], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0))[0]
    lps = [entry.logprob for entry in out.prompt_logprobs if entry is not None]
    return math.exp(-sum(lps) / len(lps))


def _decode_tok_s(llm: LLM, prompts: list[list[int]], tokens: int) -> tuple[float, float]:
    """Decode output tokens per wall second and per process-CPU second (the latter is steadier on
    a shared machine: it does not count the time other processes hold the cores)."""
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0))  # warm: kernels built, pages touched
    wall, cpu = time.perf_counter(), time.process_time()
    outs = llm.generate(prompts, params)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    n = sum(len(o.token_ids) for o in outs)
    return n / wall, n / cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="also bf16 activations (fp32 stays the reference)")
    ap.add_argument("--out", default="quantization_int4")
    args = ap.parse_args()
    load_start = os.getloadavg()
    print(f"load average at start: {load_start}", flush=True)
    model_dir = demo_model_dir()
    n_q, n_tok, dec = (4, 12, 8) if args.quick else (24, 32, 32)
    rows: list[dict] = []
    reference: list[list[int]] = []
    for name, quant, group, dtype in CONFIGS + (BF16_CONFIGS if args.bf16 else []):
        llm = _llm(model_dir, quant, group, dtype)
        tok = llm.engine.tokenizer
        text = tok.encode(TEXT.read_text())[: 128 if args.quick else 512]
        prompts = [chat_prompt(tok, q) for q in QUESTIONS[:n_q]]
        outs = llm.generate(prompts, SamplingParams(max_tokens=n_tok, temperature=0.0))
        got = [o.token_ids for o in outs]
        if not reference:
            reference = got
        lead = [
            next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), min(len(g), len(r)))
            for g, r in zip(got, reference)
        ]
        rows.append(
            {
                "config": name,
                "weight_MB": round(weight_bytes(llm.engine.runner.model) / 2**20, 1),
                "perplexity": round(_perplexity(llm, text), 3),
                "greedy_identical": f"{sum(g == r for g, r in zip(got, reference))}/{len(got)}",
                "mean_leading_equal": round(sum(lead) / len(lead), 1),
            }
        )
        for batch in (1, 16):
            wall, cpu = _decode_tok_s(llm, (prompts * 16)[:batch], dec)
            rows[-1][f"decode_tok_s_b{batch}"] = round(wall, 1)
            rows[-1][f"decode_tok_cpu_s_b{batch}"] = round(cpu, 1)
        print(rows[-1], flush=True)
        del llm
    kind = cpu_kind()
    meta = {
        "cpu": kind.model,
        "cpu_kind": kind.name,
        "flags": list(kind.flags),
        "machine": platform.machine(),
        "load_average_start": load_start,
        "load_average": os.getloadavg(),
        "torch_threads": torch.get_num_threads(),
        "questions": n_q,
        "tokens": n_tok,
    }
    print(
        f"CPU: {kind.model} (kind {kind.name}, flags {' '.join(kind.flags)}); load average at start "
        f"{load_start}, at end {meta['load_average']}"
    )
    print_table(rows, list(rows[0]))
    write_json(args.out, {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
