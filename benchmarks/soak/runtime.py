"""Does ``loraplex serve`` survive ordinary use under its default runtime? (issue 32)

The crash shape: streaming chat clients, adapters loaded/unloaded through vLLM's
``/v1/load_lora_adapter`` and the admin API, idle gaps longer than the server's worker threads live
(``tests/harness/crash_soak.py``). Each configuration runs ``--runs`` times on a fresh data dir for
``--duration`` seconds (or until the process dies); reported per configuration: runs that crashed,
the time of each death, exit codes (-11 = SIGSEGV), streams completed, 5xx answers.

    .venv/bin/python -m benchmarks.soak.runtime                           # this tree, default launch
    .venv/bin/python -m benchmarks.soak.runtime --before /old/.venv/bin/python --runs 3
    .venv/bin/python -m benchmarks.soak.runtime --model demo --duration 240  # the SmolLM2 demo model

Configurations: ``default`` (as ``loraplex serve`` starts: fast runtime on), ``off``
(``LORAPLEX_FAST_RUNTIME=0``), ``dist`` (the fast runtime with Intel OpenMP's ``dist`` barrier
patterns set by the user, as the launch set them before issue 32: with them a second short-lived
thread that ran torch crashes the process, so this configuration detects torch work on anyio's
worker threads); with ``--before PYTHON`` the same for another checkout's interpreter.
"""

from __future__ import annotations

import argparse
import os
import platform as host
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.lib.workload import print_table, write_json

ADMIN_KEY = "lpx-admin-soak-runtime-key-0123456789"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "loraplex" / "test-models"


def model_and_adapter(kind: str, root: Path) -> tuple[Path, Path]:
    """The base model (``tiny``: the random demo model; ``demo``: SmolLM2-135M, converted once into
    the tests' cache) and one PEFT adapter on it with non-zero weights."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    if kind == "demo":
        from loraplex.engine.real_model import DEMO_MODEL_NAME, ensure_demo_checkpoint

        base = ensure_demo_checkpoint(CACHE / DEMO_MODEL_NAME, dtype="bfloat16")
    else:
        from loraplex.engine.demo_model import ensure_demo_model

        base = Path(ensure_demo_model(root / "tiny-model"))
    adapter = root / f"adapter-{kind}"
    if not (adapter / "adapter_model.safetensors").is_file():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
        cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        get_peft_model(model, cfg).save_pretrained(str(adapter), safe_serialization=True)
    return Path(base), adapter


def one_run(python: str, base: Path, adapter: Path, env: dict, args, root: Path) -> dict:
    from tests.harness.crash_soak import CrashSoak
    from tests.harness.serve import ServeProcess

    data = Path(tempfile.mkdtemp(prefix="lpx-soakrt-", dir=root))
    # A default launch serves file:// only from <data_dir>/adapter-files: vLLM's load route must
    # find the adapter there, or every load is a 400 and the soak skips the path that crashed.
    served_adapter = data / "d" / "adapter-files" / adapter.name
    shutil.copytree(adapter, served_adapter)
    config = None if args.model == "demo" else "[engine]\nkv_cache_memory_gb = 0.1\n"
    server = ServeProcess(data / "d", base, admin_key=ADMIN_KEY, env=env, config=config, python=python, clean_env=True)
    try:
        runtime = next((ln for ln in server.output().splitlines() if "runtime" in ln.lower()), "")
        soak = CrashSoak(
            server.url,
            ADMIN_KEY,
            served_adapter,
            lambda: server.proc.poll() is None,
            clients=args.clients,
            active_s=args.active,
            idle_s=args.idle,
            mixed=args.mixed,
            long_prompt_every=args.long_prompt_every,
        )
        result = soak.run(duration_s=args.duration)
        out = result.summary()
        out["exit_code"] = server.proc.poll()
        tail = server.output()[-6000:]
        out["log_tail"] = tail if out["exit_code"] is not None else ""
        out["runtime_line"] = runtime
        return out
    finally:
        server.stop(timeout=20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("tiny", "demo"), default="tiny")
    ap.add_argument("--duration", type=float, default=150.0, help="seconds per run (if it lives)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--active", type=float, default=8.0, help="seconds of traffic per round")
    ap.add_argument("--idle", type=float, default=12.0, help="seconds of silence per round (> 10)")
    ap.add_argument("--configs", default="default,off")
    ap.add_argument("--mixed", action="store_true", help="also structured output, logprobs, tokenize, Responses")
    ap.add_argument(
        "--long-prompt-every", type=int, default=0, help="every Nth chat stream has a ~150-400-token prompt (0: none)"
    )
    ap.add_argument("--before", help="another checkout's python: its runs are labelled 'before'")
    ap.add_argument("--name", default="soak_runtime")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="lpx-soakrt-"))
    base, adapter = model_and_adapter(args.model, root)
    dist = {
        k: "dist,dist"
        for k in ("KMP_FORKJOIN_BARRIER_PATTERN", "KMP_PLAIN_BARRIER_PATTERN", "KMP_REDUCTION_BARRIER_PATTERN")
    }
    envs = {"default": {}, "off": {"LORAPLEX_FAST_RUNTIME": "0"}, "dist": dist}
    pythons = [("after", sys.executable)] + ([("before", args.before)] if args.before else [])
    rows, details = [], []
    for r in range(args.runs):  # configurations alternate, so the machine's load hits all alike
        for label, python in pythons:
            for cfg in args.configs.split(","):
                out = one_run(python, base, adapter, dict(envs[cfg]), args, root)
                out.update(tree=label, config=cfg, run=r, load=os.getloadavg()[0])
                details.append(out)
                print(
                    f"{label}/{cfg} run {r}: died_at={out['died_at_s']} exit={out['exit_code']} "
                    f"rounds={out['rounds']} streams={out['streams_ok']} 5xx={out['5xx']} load={out['load']:.1f}",
                    flush=True,
                )
                if out["log_tail"]:
                    print(out["log_tail"][-2500:], flush=True)
    for label, _ in pythons:
        for cfg in args.configs.split(","):
            runs = [d for d in details if d["tree"] == label and d["config"] == cfg]
            rows.append(
                {
                    "tree": label,
                    "config": cfg,
                    "runs": len(runs),
                    "crashed": sum(d["died_at_s"] is not None for d in runs),
                    "died at (s)": ",".join(str(d["died_at_s"]) for d in runs if d["died_at_s"] is not None),
                    "exit codes": ",".join(str(d["exit_code"]) for d in runs if d["exit_code"] is not None),
                    "streams": sum(d["streams_ok"] for d in runs),
                    # loads that reached the engine (a soak whose loads all fail tests nothing)
                    "vllm loads": sum(d["statuses"].get("vllm.load 200", 0) for d in runs),
                    "uploads": sum(d["statuses"].get("admin.upload 201", 0) for d in runs),
                    "5xx": sum(d["5xx"] for d in runs),
                    "run s": ",".join(str(d["elapsed_s"]) for d in runs),
                }
            )
    print_table(rows, list(rows[0]))
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo"], capture_output=True, text=True).stdout
    path = write_json(
        args.name,
        {
            "args": vars(args),
            "cpu": cpu.strip(),
            "host": host.node(),
            "rows": rows,
            "runs": details,
            "when": time.time(),
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
