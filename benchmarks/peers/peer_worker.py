"""One serving system (loraplex or vLLM) held loaded, running the shared workload on command.

Started by ``vllm_vs_loraplex.py`` with the interpreter of the system's own environment (vLLM lives
in its own venv), so this file imports nothing from the project at module level. Protocol, one JSON
object per line: the worker prints ``{"ready": ..., "startup_s": ...}`` once loaded, then answers
every ``run`` line on stdin with ``{"wall_s", "output_tokens", "token_ids"?}``; EOF ends it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _load_loraplex(cfg: dict):
    import torch

    from loraplex.engine import LLM, SamplingParams

    torch.set_num_threads(cfg["threads"])
    llm = LLM(
        cfg["model"],
        dtype=cfg["dtype"],
        kernel_backend=cfg.get("kernel_backend", "auto"),
        max_num_seqs=cfg["max_num_seqs"],
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
        max_loras=cfg["max_loras"],
        max_cpu_loras=max(cfg["max_loras"], len(cfg["adapters"])),
        max_lora_rank=cfg["max_lora_rank"],
        scheduling_policy="fcfs",
        seed=0,
    )
    for name, path in cfg["adapters"].items():
        llm.add_adapter(name, path)

    def run(prompts: list[list[int]], adapters: list[str | None], max_tokens: int) -> list[list[int]]:
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        return [list(o.token_ids) for o in llm.generate(prompts, sp, adapters=adapters)]

    return run


def _load_vllm(cfg: dict):
    # vLLM's CPU backend reads its settings from the environment; set before importing it.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{cfg['threads'] - 1}")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    use_lora = bool(cfg["adapters"])
    kwargs = (
        dict(
            enable_lora=True,
            max_loras=cfg["max_loras"],
            max_lora_rank=cfg["max_lora_rank"],
            max_cpu_loras=max(cfg["max_loras"], len(cfg["adapters"])),
        )
        if use_lora
        else {}
    )
    llm = LLM(
        model=cfg["model"],
        dtype=cfg["dtype"],
        max_num_seqs=cfg["max_num_seqs"],
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
        seed=0,
        **kwargs,
    )
    requests = {name: LoRARequest(name, i + 1, path) for i, (name, path) in enumerate(cfg["adapters"].items())}

    def run(prompts: list[list[int]], adapters: list[str | None], max_tokens: int) -> list[list[int]]:
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        lora = [requests[a] if a else None for a in adapters] if use_lora else None
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, lora_request=lora, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", choices=["loraplex", "vllm"], required=True)
    ap.add_argument("--config", required=True, help="JSON file: model, dtype, adapters, workload, limits")
    args = ap.parse_args()
    with open(args.config) as f:
        cfg = json.load(f)
    t0 = time.perf_counter()
    run = (_load_loraplex if args.system == "loraplex" else _load_vllm)(cfg)
    startup = time.perf_counter() - t0
    work = cfg["workload"]
    run(work["prompts"][:8], work["adapters"][:8], 4)  # warm-up (first-call allocations, lazy builds)
    print(json.dumps({"ready": True, "startup_s": startup}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            continue
        t = time.perf_counter()
        outs = run(work["prompts"], work["adapters"], work["max_tokens"])
        wall = time.perf_counter() - t
        print(json.dumps({"wall_s": wall, "output_tokens": sum(len(o) for o in outs), "token_ids": outs}), flush=True)


if __name__ == "__main__":
    main()
