"""Background client load for fault tests: threads looping over short completions and streams,
remembering what each client actually saw (ids, usage, chunks and when they arrived)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class Seen:
    kind: str
    status: int = 0
    request_id: str | None = None
    completion_tokens: int | None = None  # from the response's usage (completed requests only)
    chunk_times: list[float] = field(default_factory=list)
    done: bool = False
    retry_after: str | None = None
    error: str | None = None


class Traffic:
    def __init__(
        self,
        url: str,
        key: str,
        model: str,
        *,
        short: int = 2,
        streams: int = 1,
        long_streams: int = 0,
        stream_tokens: int = 40,
    ) -> None:
        self.url, self.key, self.model = url, key, model
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = (
            [threading.Thread(target=self._loop, args=("short", 6), daemon=True) for _ in range(short)]
            + [threading.Thread(target=self._loop, args=("stream", stream_tokens), daemon=True) for _ in range(streams)]
            + [threading.Thread(target=self._loop, args=("long", 1500), daemon=True) for _ in range(long_streams)]
        )

    def start(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout: float = 60) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout)

    def completed(self) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.done and s.status == 200]

    def _loop(self, kind: str, max_tokens: int) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=httpx.Timeout(60, connect=2)) as c:
            while not self._stop.is_set():
                seen = Seen(kind)
                with self._lock:
                    self.seen.append(seen)
                body = {"model": self.model, "prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0}
                try:
                    if kind == "short":
                        r = c.post("/v1/completions", json=body)
                        seen.status, seen.retry_after = r.status_code, r.headers.get("retry-after")
                        if r.status_code == 200:
                            data = r.json()
                            seen.request_id = data["id"].removeprefix("cmpl-")
                            seen.completion_tokens = data["usage"]["completion_tokens"]
                            seen.done = True
                    else:
                        self._stream(c, {**body, "stream": True, "stream_options": {"include_usage": True}}, seen)
                except (httpx.HTTPError, json.JSONDecodeError) as exc:
                    seen.error = repr(exc)
                if seen.status != 200:
                    time.sleep(0.1)
                if kind == "long" and seen.error:  # the server is gone: wait for the test to go on
                    return

    @staticmethod
    def _stream(c: httpx.Client, body: dict, seen: Seen) -> None:
        with c.stream("POST", "/v1/completions", json=body) as r:
            seen.status, seen.retry_after = r.status_code, r.headers.get("retry-after")
            if r.status_code != 200:
                r.read()
                return
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    seen.done = seen.completion_tokens is not None
                    return
                event = json.loads(line[6:])
                if "error" in event:
                    seen.error = event["error"]["message"]
                    continue
                seen.request_id = event["id"].removeprefix("cmpl-")
                if event.get("usage"):
                    seen.completion_tokens = event["usage"]["completion_tokens"]
                if any(ch.get("text") for ch in event.get("choices", [])):
                    seen.chunk_times.append(time.monotonic())
