"""loraplex vs vLLM's CPU build on this machine: same checkpoint, same PEFT adapters, same workload.

    benchmarks/peers/install_vllm.sh                                   # once: vLLM into its own venv
    .venv/bin/python -m benchmarks.peers.vllm_vs_loraplex              # full table (~20-30 min on 2 cores)
    .venv/bin/python -m benchmarks.peers.vllm_vs_loraplex --quick      # smoke run

One random Llama (the ``bench`` preset: hidden 512, 8 layers) and 64 PEFT LoRA adapters (ranks 8-64
on q/k/v/o) are written once to a temp dir; both systems load those same files. Workload: a burst of
``--requests`` prompts (16-96 random tokens), ``--output-tokens`` greedy tokens each (EOS ignored),
adapters drawn from a power law (as ``benchmarks/engine/multi_lora.py``). For every (dtype, adapters)
configuration both systems are started and held loaded, then run the workload ALTERNATELY
(A B C, C B A, ...) ``--repeats`` times; the table shows medians of output tok/s
and the ratio loraplex / vLLM. Both run with ``--threads`` threads; vLLM with the tcmalloc + Intel
OpenMP preload its docs recommend. Greedy outputs are compared token for token (fp32 should agree).
``ratio`` compares wall-clock output tok/s; ``cpu_ratio`` compares output tokens per CPU-second of
each system's whole process tree, which is less disturbed when other work shares the machine.
Not part of CI. On a shared machine alternation cancels slow drifts, not bursts: note the load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.lib.adapters import RANKS, write_peft_adapter
from benchmarks.lib.paths import VLLM_VENV
from benchmarks.lib.workload import print_table, write_json

HERE = Path(__file__).resolve().parent

TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def _tree_cpu_seconds(root: int) -> float:
    """utime + stime of a process and all its descendants (vLLM runs its engine in child processes)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += times.get(pid, 0.0)
        stack.extend(c for c, p in parents.items() if p == pid)
    return total


class Worker:
    """A peer_worker.py subprocess holding one system loaded."""

    def __init__(self, system: str, python: str, cfg_path: Path, env: dict[str, str], log: Path):
        self.system = system
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [python, str(HERE / "peer_worker.py"), "--system", system, "--config", str(cfg_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
            bufsize=1,
        )
        self.startup_s = self._reply()["startup_s"]

    def _reply(self) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # vLLM logs to stdout too: skip anything that is not ours
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    pass
            self._log.write(line)
        raise RuntimeError(f"{self.system} worker exited (rc={self.proc.wait()}); see {self._log.name}")

    def run(self) -> dict:
        assert self.proc.stdin is not None
        cpu0 = _tree_cpu_seconds(self.proc.pid)
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        reply = self._reply()
        reply["cpu_s"] = _tree_cpu_seconds(self.proc.pid) - cpu0
        return reply

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def make_workload(n: int, num_adapters: int, out_tokens: int, vocab: int, seed: int) -> dict:
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) for i in range(num_adapters)]
    prompts = [[rng.randrange(10, vocab) for _ in range(rng.randint(16, 96))] for _ in range(n)]
    adapters = [f"lora{rng.choices(range(num_adapters), weights)[0]}" if num_adapters else None for _ in range(n)]
    return {"prompts": prompts, "adapters": adapters, "max_tokens": out_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-venv", type=Path, default=VLLM_VENV)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--adapters", default="0,8,64", help="numbers of distinct adapters, one configuration each")
    ap.add_argument("--fp32-adapters", default="0,8", help="adapter counts run in float32 (subset of --adapters)")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-loras", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--kernel-backends",
        default="auto",
        help="loraplex kernel_backend(s), comma-separated: each is a system of its own (e.g. torch,cpu "
        "= before/after the native CPU attention)",
    )
    ap.add_argument(
        "--loraplex-preload",
        action="store_true",
        help="give loraplex vLLM's preload too (tcmalloc + the vLLM venv's Intel OpenMP, which then "
        "serves torch's GOMP calls)",
    )
    ap.add_argument("--quick", action="store_true", help="64 requests x 16 tokens, 1 repeat, bf16 base + 8")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.output_tokens, args.repeats = 64, 16, 1
        args.dtypes, args.adapters, args.fp32_adapters = "bfloat16", "0,8", ""
    vpy = args.vllm_venv / "bin" / "python"
    if not vpy.is_file():
        sys.exit(f"no vLLM venv at {args.vllm_venv}: run benchmarks/peers/install_vllm.sh first")
    counts = [int(x) for x in args.adapters.split(",") if x]
    backends = [b for b in args.kernel_backends.split(",") if b]
    fp32_counts = {int(x) for x in args.fp32_adapters.split(",") if x}

    base_env = {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": str(args.threads),
    }
    preload = [p for p in (TCMALLOC, str(args.vllm_venv / "lib" / "libiomp5.so")) if os.path.exists(p)]
    vllm_env = {**base_env, "LD_PRELOAD": ":".join(preload)}
    lp_env = {**base_env, **({"LD_PRELOAD": ":".join(preload)} if args.loraplex_preload and preload else {})}

    from loraplex.engine.demo_model import create_random_checkpoint

    rows, raw = [], []
    with tempfile.TemporaryDirectory(prefix="lp-peers-") as tmp:
        model_dir = str(create_random_checkpoint(Path(tmp) / "model", preset="bench", seed=0))
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        all_adapters = {
            f"lora{i}": write_peft_adapter(Path(tmp) / f"lora{i}", model_dir, cfg, RANKS[i % len(RANKS)], seed=i)
            for i in range(max(counts))
        }
        for dtype in args.dtypes.split(","):
            for n in counts:
                if dtype == "float32" and n not in fp32_counts:
                    continue
                adapters = {f"lora{i}": all_adapters[f"lora{i}"] for i in range(n)}
                work = make_workload(args.requests, n, args.output_tokens, cfg["vocab_size"], seed=0)
                spec = {
                    "model": model_dir,
                    "dtype": dtype,
                    "adapters": adapters,
                    "workload": work,
                    "threads": args.threads,
                    "max_num_seqs": args.max_num_seqs,
                    "max_num_batched_tokens": 1024,
                    "max_loras": args.max_loras,
                    "max_lora_rank": max(RANKS),
                }
                print(f"{dtype}, {n} adapters: starting {len(backends) + 1} systems ...", flush=True)
                workers: dict[str, Worker] = {}
                try:
                    for b in backends:
                        path = Path(tmp) / f"cfg-{dtype}-{n}-{b}.json"
                        path.write_text(json.dumps({**spec, "kernel_backend": b}))
                        workers[f"loraplex[{b}]"] = Worker(
                            "loraplex", sys.executable, path, lp_env, Path(tmp) / f"lp-{dtype}-{n}-{b}.log"
                        )
                    path = Path(tmp) / f"cfg-{dtype}-{n}-vllm.json"
                    path.write_text(json.dumps(spec))
                    workers["vllm"] = Worker("vllm", str(vpy), path, vllm_env, Path(tmp) / f"vllm-{dtype}-{n}.log")
                    tps: dict[str, list[float]] = {name: [] for name in workers}
                    cps: dict[str, list[float]] = {name: [] for name in workers}  # tokens per CPU-second
                    first: dict[str, list] = {}
                    names = list(workers)
                    for rep in range(args.repeats):
                        order = names if rep % 2 == 0 else names[::-1]  # alternate: A B C, C B A, ...
                        for name in order:
                            r = workers[name].run()
                            tps[name].append(r["output_tokens"] / r["wall_s"])
                            cps[name].append(r["output_tokens"] / max(r["cpu_s"], 1e-9))
                            first.setdefault(name, r["token_ids"])
                            print(
                                f"  {name:16s} run {rep + 1}: {tps[name][-1]:8.1f} output tok/s, "
                                f"{cps[name][-1]:8.1f} per CPU-s (load {os.getloadavg()[0]:.1f})",
                                flush=True,
                            )
                finally:
                    for w in workers.values():
                        w.close()
                vl, vl_cpu = statistics.median(tps["vllm"]), statistics.median(cps["vllm"])
                for name in names[:-1]:
                    same = sum(a == b for a, b in zip(first[name], first["vllm"]))
                    lp, lp_cpu = statistics.median(tps[name]), statistics.median(cps[name])
                    rows.append(
                        {
                            "dtype": dtype,
                            "adapters": n,
                            "system": name,
                            "tok_s": lp,
                            "vllm_tok_s": vl,
                            "ratio": lp / vl,
                            "tok_per_cpu_s": lp_cpu,
                            "vllm_tok_per_cpu_s": vl_cpu,
                            "cpu_ratio": lp_cpu / vl_cpu,
                            "startup_s": workers[name].startup_s,
                            "vllm_startup_s": workers["vllm"].startup_s,
                            "greedy_same_as_vllm": f"{same}/{len(first['vllm'])}",
                        }
                    )
                raw.append({"dtype": dtype, "adapters": n, "tok_s": tps, "tok_per_cpu_s": cps})
    print()
    print_table(
        rows,
        [
            "dtype",
            "adapters",
            "system",
            "tok_s",
            "vllm_tok_s",
            "ratio",
            "cpu_ratio",
            "startup_s",
            "vllm_startup_s",
            "greedy_same_as_vllm",
        ],
    )
    path = write_json(
        "peers_vllm",
        {
            "workload": {
                "requests": args.requests,
                "output_tokens": args.output_tokens,
                "preset": "bench",
                "threads": args.threads,
                "repeats": args.repeats,
                "max_num_seqs": args.max_num_seqs,
                "max_loras": args.max_loras,
                "kernel_backends": backends,
                "loraplex_preload": args.loraplex_preload,
                "vllm_preload": preload,
            },
            "results": rows,
            "runs": raw,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
