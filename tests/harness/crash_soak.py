"""The traffic that killed ``loraplex serve`` (issue 32): streaming chat clients, adapters loaded and
unloaded through both adapter APIs, and idle gaps longer than the server's worker threads live.

Written once, for ``tests/platform/test_crash_soak.py`` (CI size) and ``benchmarks/soak/runtime.py``
(minutes, several runtime configurations). A round is an active phase (``clients`` threads stream
chat completions back to back while one admin thread loads an adapter through vLLM's
``/v1/load_lora_adapter``, streams with it, unloads it, then uploads one through
``/admin/v1/adapters``, streams with it and deletes it) followed by an idle gap in which no request
reaches the server at all: anyio's idle worker threads (the threads FastAPI runs sync routes in,
which had loaded adapters with torch) exit after 10 s idle, and that exit is what crashed the
process. The server's liveness is watched through its process (``poll``), never over HTTP, so the
gap stays idle.
"""

from __future__ import annotations

import io
import json
import threading
import time
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ANYIO_WORKER_IDLE_S = 10.0  # anyio.WorkerThread.MAX_IDLE_TIME: the gap must be longer


@dataclass
class SoakResult:
    rounds: int = 0
    streams_ok: int = 0
    statuses: Counter = field(default_factory=Counter)  # "route status" -> count
    errors: list[str] = field(default_factory=list)  # transport errors and bad answers (first few)
    died_at_s: float | None = None  # seconds after the start when the process was seen dead
    exit_code: int | None = None
    elapsed_s: float = 0.0

    @property
    def server_errors(self) -> int:
        return sum(n for k, n in self.statuses.items() if k.rsplit(" ", 1)[1].startswith("5"))

    def summary(self) -> dict:
        return {
            "rounds": self.rounds,
            "streams_ok": self.streams_ok,
            "5xx": self.server_errors,
            "died_at_s": self.died_at_s,
            "exit_code": self.exit_code,
            "elapsed_s": round(self.elapsed_s, 1),
            "statuses": dict(self.statuses),
            "errors": self.errors[:10],
        }


def zip_folder(folder: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for p in sorted(folder.iterdir()):
            if p.is_file():
                zf.writestr(p.name, p.read_bytes())
    return buf.getvalue()


class CrashSoak:
    """Drives one server. ``alive()`` says whether its process still runs (the caller's process
    handle); ``run`` returns when ``duration_s`` is spent, ``rounds`` are done, or the server died."""

    def __init__(
        self,
        url: str,
        admin_key: str,
        adapter_dir: Path,
        alive,
        *,
        clients: int = 3,
        active_s: float = 8.0,
        idle_s: float = 12.0,
        max_tokens: int = 24,
        mixed: bool = False,
        long_prompt_every: int = 0,
    ) -> None:
        self.url = url
        self.admin = {"Authorization": f"Bearer {admin_key}"}
        self.adapter_dir = Path(adapter_dir)
        self.adapter_zip = zip_folder(self.adapter_dir)
        self.alive = alive
        self.clients = clients
        self.active_s = active_s
        self.idle_s = idle_s
        self.max_tokens = max_tokens
        # mixed: clients also send structured output, logprobs, tokenize/detokenize and Responses
        # API requests (every route that may run work on a worker thread), not only chat streams
        self.mixed = mixed
        # every Nth chat stream carries a prompt of ~150-400 tokens (0: none): whole prompts long
        # enough for the native prompt-attention kernel and prompt-sized LoRA groups
        self.long_prompt_every = long_prompt_every
        self.result = SoakResult()
        self._lock = threading.Lock()
        self._started = time.monotonic()
        with httpx.Client(base_url=url, timeout=120) as c:
            tid = c.post("/admin/v1/tenants", json={"name": f"soak-{time.time_ns()}"}, headers=self.admin)
            tid.raise_for_status()
            key = c.post(f"/admin/v1/tenants/{tid.json()['id']}/keys", json={}, headers=self.admin)
            key.raise_for_status()
            self.tenant = {"Authorization": f"Bearer {key.json()['key']}"}
            models = c.get("/v1/models", headers=self.tenant).json()["data"]
            self.base_model = models[0]["id"]

    # ------------------------------------------------------------------ bookkeeping
    def _count(self, route: str, status: int | str) -> None:
        with self._lock:
            self.result.statuses[f"{route} {status}"] += 1

    def _error(self, text: str) -> None:
        with self._lock:
            if len(self.result.errors) < 50:
                self.result.errors.append(text[:300])

    def _dead(self) -> bool:
        if self.result.died_at_s is None and not self.alive():
            self.result.died_at_s = round(time.monotonic() - self._started, 1)
        return self.result.died_at_s is not None

    # ------------------------------------------------------------------ requests
    def _long_text(self, i: int) -> str:
        if not self.long_prompt_every or i % self.long_prompt_every:
            return ""
        words = "the river ran past old mills and quiet farms while children counted boats".split()
        return " Context: " + " ".join(words[(i + k) % len(words)] for k in range(100 + 37 * (i % 7)))

    def stream(self, c: httpx.Client, model: str, i: int) -> bool:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"Tell me a story number {i}." + self._long_text(i)}],
            "max_tokens": self.max_tokens,
            "stream": True,
        }
        route = "chat.stream"
        try:
            with c.stream("POST", "/v1/chat/completions", json=body, headers=self.tenant) as r:
                self._count(route, r.status_code)
                if r.status_code != 200:
                    self._error(f"{route} {model}: {r.status_code} {r.read()[:200]!r}")
                    return False
                done, finish = False, None
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: "):
                        event = json.loads(line[6:])
                        if "error" in event:
                            self._error(f"{route} {model}: error event {event['error']}")
                            return False
                        for choice in event.get("choices", []):
                            finish = choice.get("finish_reason") or finish
            if not done or finish is None:
                self._error(f"{route} {model}: ended without [DONE]/finish_reason")
                return False
            with self._lock:
                self.result.streams_ok += 1
            return True
        except httpx.HTTPError as exc:
            self._count(route, "transport-error")
            self._error(f"{route} {model}: {exc!r}")
            return False

    def other_kind(self, c: httpx.Client, i: int) -> None:
        """One request of another kind (``mixed``), in turn."""
        m, kind = self.base_model, i % 4
        if kind == 0:
            schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
            body = {
                "model": m,
                "messages": [{"role": "user", "content": f"a number, {i}"}],
                "max_tokens": 12,
                "response_format": {"type": "json_schema", "json_schema": {"name": f"s{i % 3}", "schema": schema}},
            }
            self._call(c, "chat.json_schema", "POST", "/v1/chat/completions", json=body, headers=self.tenant)
        elif kind == 1:
            body = {"model": m, "prompt": f"Once upon {i}", "max_tokens": 8, "logprobs": 2, "n": 2}
            self._call(c, "completions.logprobs", "POST", "/v1/completions", json=body, headers=self.tenant)
        elif kind == 2:
            r = self._call(
                c, "tokenize", "POST", "/tokenize", json={"model": m, "prompt": f"hello {i}"}, headers=self.tenant
            )
            if r is not None and r.status_code == 200:
                tokens = r.json().get("tokens", [])
                self._call(
                    c, "detokenize", "POST", "/detokenize", json={"model": m, "tokens": tokens}, headers=self.tenant
                )
        else:
            body = {"model": m, "input": f"Say something {i}", "max_output_tokens": 8}
            self._call(c, "responses", "POST", "/v1/responses", json=body, headers=self.tenant)

    def _call(
        self, c: httpx.Client, route: str, method: str, path: str, headers: dict | None = None, **kw
    ) -> httpx.Response | None:
        try:
            r = c.request(method, path, headers=headers or self.admin, **kw)
        except httpx.HTTPError as exc:
            self._count(route, "transport-error")
            self._error(f"{route}: {exc!r}")
            return None
        self._count(route, r.status_code)
        if r.status_code >= 400:
            self._error(f"{route}: {r.status_code} {r.text[:200]}")
        return r

    def adapter_cycle(self, c: httpx.Client, n: int) -> None:
        """vLLM API: load, use, unload; admin API: upload, use, delete."""
        name = f"soak-vllm-{n}"
        r = self._call(
            c,
            "vllm.load",
            "POST",
            "/v1/load_lora_adapter",
            json={"lora_name": name, "lora_path": str(self.adapter_dir)},
        )
        if r is not None and r.status_code == 200:
            self.stream(c, name, n)
            self._call(c, "vllm.unload", "POST", "/v1/unload_lora_adapter", json={"lora_name": name})
        name = f"soak-admin-{n}"
        r = self._call(
            c,
            "admin.upload",
            "POST",
            "/admin/v1/adapters",
            data={"name": name, "visibility": "shared"},
            files={"file": ("a.zip", self.adapter_zip)},
        )
        if r is not None and r.status_code == 201:
            self.stream(c, name, n)
            self._call(c, "admin.delete", "DELETE", f"/admin/v1/adapters/{r.json()['id']}")

    # ------------------------------------------------------------------ rounds
    def _active(self, round_no: int) -> None:
        stop = threading.Event()

        def client(k: int) -> None:
            with httpx.Client(base_url=self.url, timeout=120) as c:
                i = 0
                while not stop.is_set() and not self._dead():
                    self.stream(c, self.base_model, i)
                    if self.mixed:
                        self.other_kind(c, i + k)
                    i += 1

        threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(self.clients)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + self.active_s
        with httpx.Client(base_url=self.url, timeout=120) as c:
            n = 0
            while time.monotonic() < deadline and not self._dead():
                self.adapter_cycle(c, round_no * 1000 + n)
                n += 1
        stop.set()
        for t in threads:
            t.join()

    def _idle(self) -> None:
        """No request at all, polling only the process: the server's worker threads go idle and exit."""
        deadline = time.monotonic() + self.idle_s
        while time.monotonic() < deadline and not self._dead():
            time.sleep(0.25)

    def run(self, *, duration_s: float | None = None, rounds: int | None = None) -> SoakResult:
        assert self.idle_s > ANYIO_WORKER_IDLE_S, "the idle gap must outlast the worker threads"
        self._started = time.monotonic()
        while not self._dead():
            if rounds is not None and self.result.rounds >= rounds:
                break
            if duration_s is not None and time.monotonic() - self._started >= duration_s:
                break
            self._active(self.result.rounds)
            self._idle()
            self.result.rounds += 1
        self.result.elapsed_s = time.monotonic() - self._started
        return self.result
