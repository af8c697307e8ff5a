"""The process runtime loraplex is fastest with on CPU, applied by the launchers themselves.

Measured (docs/cpu-performance.md): with two OpenMP threads on cores that other processes share,
torch's GNU OpenMP (libgomp) threads spin at every barrier for a partner that was descheduled, many
times per layer, and glibc malloc is slow for torch's many short-lived activation buffers. Intel
OpenMP (``libiomp5``, from the ``intel-openmp`` wheel; it implements the GOMP entry points torch
calls) and tcmalloc (Debian ``libtcmalloc-minimal4``) fixed both. Both must be in the process before
anything allocates or starts an OpenMP pool, i.e. before the interpreter starts. ``loraplex serve``
owns its process, so it re-executes its own command line once with ``LD_PRELOAD`` set, when the
libraries are present and not loaded yet. A user's script is not ours to restart (the code before
``LLM(...)`` would run twice): ``LLM(...)`` only warns, once, and says how to start it under the
runtime: ``python -m loraplex.engine.runtime_env script.py [args]`` (this module's launcher; ``-m
module`` works too), or the ``LD_PRELOAD`` and variables the warning prints.

Fallbacks (each piece independently): no tcmalloc -> glibc malloc; no libiomp5 -> libgomp with
``OMP_WAIT_POLICY=PASSIVE`` (threads sleep at barriers instead of spinning, the documented libgomp
remedy for the spinning above; benchmarks/peers/runtime_variants.py compares every combination, but
it has not been run to completion on a quiet machine yet). ``LORAPLEX_FAST_RUNTIME=0`` turns all of
it off (the process runs as started).

Standard library only, and importable without importing torch: the CLI loads this file before its
own imports (see ``platform/launch.py``), so a re-exec costs no torch import.
"""

from __future__ import annotations

import importlib.metadata
import os
import shlex
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

LAUNCHER = "loraplex.engine.runtime_env"  # python -m LAUNCHER script.py: started under the runtime
MODE_ENV = "LORAPLEX_FAST_RUNTIME"  # "auto" (default) | "0" / "off": run as started
MARK_ENV = "LORAPLEX_RUNTIME_REEXEC"  # set in the re-executed process: never re-exec twice
_checked = False
_warned = False
TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
IOMP_NAME = "libiomp5.so"
# Intel OpenMP settings: sleep after 1 ms at a barrier instead of the default 200 ms of spinning
# (the cores are shared). NOT the ``dist`` barrier patterns vLLM's CPU worker also sets (kept below
# for benchmarks only): with them libiomp 2024.2 segfaults when a second thread that ran a torch op
# exits (it hands a pooled team with no barrier to the next root thread and frees that NULL barrier
# at its exit; issue 32 killed ``loraplex serve`` this way), and they measured no faster here
# (docs/cpu-performance.md). loraplex keeps its own torch work on long-lived threads anyway
# (``torch_threads.py``), but ``LLM(...)`` scripts run user threads we do not control.
IOMP_ENV = {
    "KMP_BLOCKTIME": "1",
    "KMP_TPAUSE": "0",
}
IOMP_DIST_BARRIERS = {  # not applied: see above
    "KMP_FORKJOIN_BARRIER_PATTERN": "dist,dist",
    "KMP_PLAIN_BARRIER_PATTERN": "dist,dist",
    "KMP_REDUCTION_BARRIER_PATTERN": "dist,dist",
}
GOMP_FALLBACK_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


@dataclass(frozen=True)
class RuntimePlan:
    """What the fast runtime needs here: library paths found (None = missing) and the environment."""

    tcmalloc: str | None
    iomp5: str | None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def preload(self) -> list[str]:
        return [p for p in (self.tcmalloc, self.iomp5) if p]


def enabled() -> bool:
    return os.environ.get(MODE_ENV, "auto").strip().lower() not in ("0", "off", "false", "no")


def _ldconfig_paths() -> dict[str, str]:
    """tcmalloc names -> path from the loader cache, this machine's architecture first."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    arch = {"x86_64": "x86-64", "aarch64": "AArch64"}.get(os.uname().machine, "")
    found: dict[str, str] = {}
    for line in sorted(out.splitlines(), key=lambda ln: arch not in ln):  # stable: own arch first
        name, _, path = line.strip().partition(" => ")
        name = name.split(" ", 1)[0]
        if name in TCMALLOC_NAMES and path:
            found.setdefault(name, path.strip())
    return found


def find_tcmalloc() -> str | None:
    override = os.environ.get("LORAPLEX_TCMALLOC")
    if override is not None:
        return override if override and Path(override).is_file() else None
    found = _ldconfig_paths()
    for name in TCMALLOC_NAMES:
        if name in found and Path(found[name]).is_file():
            return found[name]
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"):
        for name in TCMALLOC_NAMES:
            if (Path(d) / name).is_file():
                return str(Path(d) / name)
    return None


def find_iomp5() -> str | None:
    override = os.environ.get("LORAPLEX_IOMP5")
    if override is not None:
        return override if override and Path(override).is_file() else None
    try:  # the intel-openmp wheel installs lib/libiomp5.so under the environment's prefix
        for f in importlib.metadata.files("intel-openmp") or []:
            if f.name == IOMP_NAME:
                path = Path(str(f.locate())).resolve()
                if path.is_file():
                    return str(path)
    except importlib.metadata.PackageNotFoundError:
        pass
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        candidate = Path(prefix) / "lib" / IOMP_NAME
        if candidate.is_file():
            return str(candidate)
    return None


def plan() -> RuntimePlan:
    tcmalloc, iomp5 = find_tcmalloc(), find_iomp5()
    env = dict(IOMP_ENV) if iomp5 else dict(GOMP_FALLBACK_ENV)
    return RuntimePlan(tcmalloc=tcmalloc, iomp5=iomp5, env=env)


def loaded_libraries(pid: int | str = "self") -> set[str]:
    """Base names of the shared objects mapped into process ``pid`` (Linux /proc; empty elsewhere)."""
    try:
        text = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return set()
    return {Path(line.split()[-1]).name for line in text.splitlines() if "/" in line}


def active(pid: int | str = "self") -> dict[str, bool]:
    libs = loaded_libraries(pid)
    return {
        # maps name the real file (libtcmalloc_minimal.so.4.5.16), not the soname link.
        "tcmalloc": any(n.startswith("libtcmalloc") for n in libs),
        "iomp5": any(n.startswith("libiomp5") for n in libs),
    }


def _needs_reexec(p: RuntimePlan) -> bool:
    now = active()
    missing_lib = (p.tcmalloc and not now["tcmalloc"]) or (p.iomp5 and not now["iomp5"])
    missing_env = any(os.environ.get(k) != v for k, v in p.env.items())
    return bool(missing_lib or missing_env)


def reexec(reason: str) -> None:
    """Replace this process with the same command line under the fast runtime, if that changes
    anything. Returns (doing nothing) when turned off, already re-executed, not needed, or on a
    platform without /proc. ``reason`` names the caller in the one line printed to stderr."""
    global _checked
    if _checked:  # once per process
        return
    _checked = True
    if adopt_restart():
        return
    p = missing()
    if p is None:
        return
    argv = [sys.executable, *sys.orig_argv[1:]]
    sys.stderr.write(f"[loraplex] {reason}: restarting under {summary(p)} ({MODE_ENV}=0 to skip)\n")
    _exec(argv, p)


def adopt_restart() -> bool:
    """In a process started under the runtime by ``reexec`` or the launcher: give child processes
    (compilers, Ray's raylet, a user's subprocesses) the environment the user started with. True
    when this process is such a one."""
    if MARK_ENV not in os.environ:
        return False
    original = os.environ.pop(MARK_ENV)
    if original:
        os.environ["LD_PRELOAD"] = original
    else:
        os.environ.pop("LD_PRELOAD", None)
    return True


def missing() -> RuntimePlan | None:
    """The plan that would make this process faster, or None (turned off, not Linux, or loaded)."""
    if not enabled() or not sys.platform.startswith("linux") or not sys.executable:
        return None
    p = plan()
    return p if _needs_reexec(p) else None


def _runtime_env(p: RuntimePlan) -> dict[str, str]:
    env = dict(os.environ)
    before = env.get("LD_PRELOAD", "")
    preload = [lib for lib in before.replace(" ", ":").split(":") if lib]
    env["LD_PRELOAD"] = ":".join(dict.fromkeys([*p.preload, *preload]))
    env.update(p.env)
    env[MARK_ENV] = before  # present = started under it; its value = the LD_PRELOAD to give back
    return env


def _exec(argv: list[str], p: RuntimePlan) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(argv[0], argv, _runtime_env(p))
    except OSError as exc:  # e.g. the interpreter moved: keep running as started
        sys.stderr.write(f"[loraplex] restart failed ({exc}); running without the fast runtime\n")


class SlowRuntimeWarning(RuntimeWarning):
    """This process runs without the fast CPU runtime it could have (``warn_if_missing``)."""


def how_to_start(p: RuntimePlan) -> str:
    """The two ways to start a script under ``p``, for the warning."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in {"LD_PRELOAD": ":".join(p.preload), **p.env}.items() if v)
    return f"python -m {LAUNCHER} your_script.py [args], or: {env} python your_script.py [args]"


def warn_if_missing(caller: str) -> bool:
    """Once per process: warn (``SlowRuntimeWarning``) when the fast runtime is available but not
    loaded, saying how to start under it. Never restarts anything. True when it warned."""
    global _warned
    adopt_restart()
    if _warned:
        return False
    _warned = True
    p = missing()
    if p is None:
        return False
    warnings.warn(
        f"{caller} runs without {summary(p)}, which the CPU path is measured faster with "
        f"(docs/cpu-performance.md); it must be loaded when the process starts: {how_to_start(p)} "
        f"(`loraplex serve` does this itself). {MODE_ENV}=0 silences this.",
        SlowRuntimeWarning,
        stacklevel=3,
    )
    return True


def summary(p: RuntimePlan | None = None) -> str:
    p = p or plan()
    alloc = "tcmalloc" if p.tcmalloc else "glibc malloc"
    omp = "Intel OpenMP" if p.iomp5 else "GNU OpenMP (passive wait)"
    return f"{alloc} + {omp}"


def describe(pid: int | str = "self") -> str:
    """One line for the resolved configuration: what this process runs with, and why not faster."""
    now = active(pid)
    parts = [
        "tcmalloc" if now["tcmalloc"] else "glibc malloc",
        "Intel OpenMP" if now["iomp5"] else "GNU OpenMP",
    ]
    notes = []
    if not enabled():
        notes.append(f"{MODE_ENV}=0")
    else:
        p = plan()
        if not p.tcmalloc:
            notes.append("libtcmalloc_minimal.so.4 not found: apt-get install libtcmalloc-minimal4")
        if not p.iomp5:
            notes.append("libiomp5.so not found: pip install intel-openmp")
    wait = os.environ.get("KMP_BLOCKTIME") if now["iomp5"] else os.environ.get("OMP_WAIT_POLICY")
    text = " + ".join(parts) + (f" (wait: {'KMP_BLOCKTIME=' if now['iomp5'] else ''}{wait})" if wait else "")
    return text + (f"; {'; '.join(notes)}" if notes else "")


def launch(argv: list[str]) -> None:
    """``python -m loraplex.engine.runtime_env script.py [args]`` (or ``-m module [args]``): run it
    under the fast runtime from its first line (its ``LLM(...)`` then has nothing to warn about)."""
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(f"usage: python -m {LAUNCHER} script.py [args] | -m module [args]\n")
        raise SystemExit(0 if argv else 2)
    command = [sys.executable, *argv]
    p = missing()
    if p is None:  # off, not Linux, or nothing to add: run it as it is
        os.execv(sys.executable, command)
    assert p is not None
    _exec(command, p)
    os.execv(sys.executable, command)  # the runtime could not be applied: run it anyway


if __name__ == "__main__":
    launch(sys.argv[1:])
