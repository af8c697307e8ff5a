"""The fast CPU runtime (tcmalloc + Intel OpenMP preloaded). ``LLM(...)`` never restarts the user's
script (the code before it would run twice): it warns once and says how to start under the runtime;
the launcher it names (``python -m loraplex.engine.runtime_env script.py``) starts a real script
process under it (its /proc maps show both libraries), a missing library falls back cleanly, and
the switch turns it off. ``loraplex serve`` owns its process and still restarts itself:
tests/platform/test_serve_runtime.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from loraplex.engine import runtime_env

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD and /proc are Linux")

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    print("before", flush=True)   # code before LLM(...): must run exactly once
    from loraplex.engine import LLM, SamplingParams, runtime_env
    llm = LLM(sys.argv[1], dtype="float32", kv_cache_memory_gb=0.01, max_num_seqs=2)
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    print(json.dumps({"active": runtime_env.active(), "describe": runtime_env.describe(),
                      "tokens": len(out[0].outputs[0].token_ids), "pid": os.getpid(),
                      "env": {k: os.environ.get(k) for k in ("KMP_BLOCKTIME", "OMP_WAIT_POLICY", "LD_PRELOAD")}}))
    """
)


def _run_script(tmp_path: Path, model: str, launcher: bool = True, **env: str) -> tuple[dict, str]:
    script = tmp_path / "use_llm.py"
    script.write_text(SCRIPT)
    # A clean environment for the knobs under test (the test process itself may run preloaded).
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LORAPLEX_", "KMP_", "OMP_WAIT", "LD_PRELOAD"))}
    start = [sys.executable, "-m", runtime_env.LAUNCHER] if launcher else [sys.executable]
    proc = subprocess.run(
        [*start, str(script), model],
        env={**base, "TOKENIZERS_PARALLELISM": "false", **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout + proc.stderr


# Each of these starts a real script process (importing torch): process tests are slow
# (CONTRIBUTING.md). The whole suite runs them; the inner loop keeps the in-process checks below.
starts_a_process = pytest.mark.slow

needs_both = pytest.mark.skipif(
    not (runtime_env.find_tcmalloc() and runtime_env.find_iomp5()),
    reason="tcmalloc (libtcmalloc-minimal4) and intel-openmp are installed by the set-up; missing here",
)


@starts_a_process
@needs_both
def test_plain_script_is_not_restarted_and_is_told_how_to_get_the_runtime(tmp_path, tiny_llama):
    got, output = _run_script(tmp_path, tiny_llama, launcher=False)
    assert output.count("before") == 1  # the user's code ran once: no re-execution
    assert "restarting" not in output and got["tokens"] == 3
    assert got["active"] == {"tcmalloc": False, "iomp5": False}
    assert output.count("SlowRuntimeWarning") == 1  # once, naming the way to start under it
    assert f"python -m {runtime_env.LAUNCHER} your_script.py" in output and "LD_PRELOAD=" in output


@starts_a_process
@needs_both
def test_launcher_starts_the_script_under_tcmalloc_and_intel_openmp(tmp_path, tiny_llama):
    got, output = _run_script(tmp_path, tiny_llama)
    assert got["active"] == {"tcmalloc": True, "iomp5": True}, output
    assert got["env"]["KMP_BLOCKTIME"] == "1"
    assert got["tokens"] == 3  # the model really ran under the Intel OpenMP runtime
    assert "tcmalloc + Intel OpenMP" in got["describe"]
    assert output.count("before") == 1 and "SlowRuntimeWarning" not in output
    assert got["env"]["LD_PRELOAD"] is None  # given back: subprocesses start as the user started this one


@starts_a_process
def test_broken_library_file_does_not_loop(tmp_path, tiny_llama):
    """A "library" that is not one: the loader skips it, the script runs once, and is told."""
    not_a_library = tmp_path / "libtcmalloc_minimal.so.4"
    not_a_library.write_text("not an ELF file")
    got, output = _run_script(tmp_path, tiny_llama, LORAPLEX_TCMALLOC=str(not_a_library), LORAPLEX_IOMP5="")
    assert got["active"]["tcmalloc"] is False and got["tokens"] == 3
    assert output.count("before") == 1 and "restarting" not in output


@starts_a_process
@needs_both
def test_missing_intel_openmp_falls_back_to_gomp_passive(tmp_path, tiny_llama):
    got, output = _run_script(tmp_path, tiny_llama, LORAPLEX_IOMP5="")
    assert got["active"] == {"tcmalloc": True, "iomp5": False}, output
    assert got["env"]["OMP_WAIT_POLICY"] == "PASSIVE" and got["env"]["KMP_BLOCKTIME"] is None
    assert got["tokens"] == 3
    assert "libiomp5.so not found" in got["describe"]


@starts_a_process
def test_missing_everything_and_switch_off_run_as_started(tmp_path, tiny_llama):
    got, output = _run_script(tmp_path, tiny_llama, LORAPLEX_IOMP5="", LORAPLEX_TCMALLOC="/nonexistent/libtc.so")
    assert got["active"] == {"tcmalloc": False, "iomp5": False}
    assert got["env"]["OMP_WAIT_POLICY"] == "PASSIVE"  # the measured fallback still applies
    assert "apt-get install libtcmalloc-minimal4" in got["describe"]
    off, output = _run_script(tmp_path, tiny_llama, launcher=False, LORAPLEX_FAST_RUNTIME="0")
    assert off["active"] == {"tcmalloc": False, "iomp5": False} and off["env"]["OMP_WAIT_POLICY"] is None
    assert output.count("before") == 1 and "SlowRuntimeWarning" not in output
    assert f"{runtime_env.MODE_ENV}=0" in off["describe"]


def test_warning_is_given_once_and_never_with_the_switch_off(monkeypatch):
    monkeypatch.setattr(runtime_env, "_warned", False)
    monkeypatch.setenv(runtime_env.MODE_ENV, "0")
    assert runtime_env.warn_if_missing("LLM(...)") is False  # off: nothing to say
    monkeypatch.setattr(runtime_env, "_warned", False)
    monkeypatch.delenv(runtime_env.MODE_ENV)
    first = runtime_env.warn_if_missing("LLM(...)")
    assert first == (runtime_env.missing() is not None)  # warns exactly when something is missing
    assert runtime_env.warn_if_missing("LLM(...)") is False  # and only once per process


def test_loaded_libraries_reads_proc_maps():
    libs = runtime_env.loaded_libraries()
    assert any(name.startswith("libc.so") or name.startswith("libc-") for name in libs)
    assert runtime_env.loaded_libraries(pid=2**22 + 7) == set()  # no such process: empty, no error
