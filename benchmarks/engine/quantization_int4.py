"""INT4 weight-only (group-wise, ``quantization="int4"``) against fp32 and INT8, on the REAL demo model
(SmolLM2-135M-Instruct): what each costs in quality and what it saves in memory, on this CPU.

    .venv/bin/python -m benchmarks.engine.quantization_int4             # ~3-5 minutes on 2 cores
    .venv/bin/python -m benchmarks.engine.quantization_int4 --quick     # smoke run

Per configuration (all fp32 activations, native CPU kernels, one process, one after another):
weight bytes (parameters + persistent buffers), perplexity of benchmarks/data/perplexity_text.txt
(prompt logprobs: every token given the ones before it), greedy agreement with the fp32 model over
chat questions (whole outputs identical, and mean leading tokens equal), and decode output tok/s
at batch 1 and 16 (steady state, prefill excluded; on a shared machine compare the ratios, and the
load average printed with the table). The CPU model and flags go into the JSON.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
from pathlib import Path

from benchmarks.lib.real_text import QUESTIONS, chat_prompt, demo_model_dir
from benchmarks.lib.workload import print_table, write_json
from loraplex.engine import LLM, SamplingParams
from loraplex.engine.models.quantization import weight_bytes
from loraplex.kernels.cpu_packed import cpu_kind

TEXT = Path(__file__).resolve().parents[1] / "data" / "perplexity_text.txt"
CONFIGS = [  # name, quantization, group size
    ("fp32", None, None),
    ("int8", "int8", None),
    ("int4 g128", "int4", 128),
    ("int4 g64", "int4", 64),
    ("int4 g32", "int4", 32),
]


def _llm(model_dir: Path, quantization: str | None, group: int | None) -> LLM:
    extra = {"quantization_group_size": group} if group else {}
    return LLM(model=str(model_dir), dtype="float32", quantization=quantization, kernel_backend="cpu", **extra)


def _perplexity(llm: LLM, tokens: list[int]) -> float:
    out = llm.generate([tokens], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0))[0]
    lps = [entry.logprob for entry in out.prompt_logprobs if entry is not None]
    return math.exp(-sum(lps) / len(lps))


def _decode_tok_s(llm: LLM, prompts: list[list[int]], tokens: int) -> float:
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0))  # warm: kernels built, pages touched
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="quantization_int4")
    args = ap.parse_args()
    model_dir = demo_model_dir()
    n_q, n_tok, dec = (4, 12, 8) if args.quick else (24, 32, 32)
    rows: list[dict] = []
    reference: list[list[int]] = []
    for name, quant, group in CONFIGS:
        llm = _llm(model_dir, quant, group)
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
                "decode_tok_s_b1": round(_decode_tok_s(llm, prompts[:1], dec), 1),
                "decode_tok_s_b16": round(_decode_tok_s(llm, (prompts * 16)[:16], dec), 1),
            }
        )
        print(rows[-1], flush=True)
        del llm
    kind = cpu_kind()
    meta = {
        "cpu": kind.model,
        "cpu_kind": kind.name,
        "flags": list(kind.flags),
        "machine": platform.machine(),
        "load_average": os.getloadavg(),
        "questions": n_q,
        "tokens": n_tok,
    }
    print(f"CPU: {kind.model} (kind {kind.name}, flags {' '.join(kind.flags)}); load average {meta['load_average']}")
    print_table(rows, list(rows[0]))
    write_json(args.out, {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
