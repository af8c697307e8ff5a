"""AsyncEngine: the step loop in a background thread, requests as async iterators (for servers).

    engine = AsyncEngine(EngineConfig(model=...)); engine.start()
    async for out in engine.submit(prompt_ids, SamplingParams(max_tokens=64), tenant_id="acme"):
        ...   # cumulative RequestOutput after every step that changed it; the last has finished=True
    engine.shutdown()

The loop thread and callers share the LLMEngine under one lock, held for a whole step, so admin
calls (add_adapter, set_tenant) land between two steps and affect the very next one.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from typing import Any

from .config import EngineConfig
from .errors import EngineDeadError
from .llm_engine import UNCHANGED, LLMEngine
from .outputs import RequestOutput
from .sampling_params import SamplingParams, StructuredOutputSpec

log = logging.getLogger("loraplex.engine")


class RequestStream:
    """Async iterator over one request's outputs. Closing it early aborts the request."""

    def __init__(self, engine: "AsyncEngine", request_id: str, loop: asyncio.AbstractEventLoop):
        self.request_id = request_id
        self._engine = engine
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self.finished = False

    def _push(self, item: RequestOutput | BaseException) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def __aiter__(self):
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        # Several steps may have queued up: skip to the newest (outputs are cumulative).
        while not item.finished and not self._queue.empty():
            nxt = self._queue.get_nowait()
            if isinstance(nxt, BaseException):
                self.finished = True
                raise nxt
            item = nxt
        if item.finished:
            self.finished = True
        return item

    async def aclose(self) -> None:
        if not self.finished:
            self.finished = True
            self._engine.abort(self.request_id)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


class AsyncEngine:
    def __init__(self, config: EngineConfig | None = None, *, engine: LLMEngine | None = None):
        if engine is None:
            if config is None:
                raise ValueError("AsyncEngine needs an EngineConfig or an LLMEngine")
            engine = LLMEngine(config)
        self.engine = engine
        self.engine.stream_text = True
        self._cond = threading.Condition()
        self._streams: dict[str, RequestStream] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.dead: BaseException | None = None

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "AsyncEngine":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="loraplex-engine", daemon=True)
            self._thread.start()
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._cond:
            for rid in list(self._streams):
                out = self.engine.abort_request(rid)
                stream = self._streams.pop(rid)
                stream._push(out if out is not None else EngineDeadError("engine shut down"))

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.dead is None

    # ------------------------------------------------------------------ requests
    def submit(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        adapter: str | None = None,
        tenant_id: str = "default",
        priority: int | None = None,
        weight: float | None = None,
        cache_salt: str | None = None,
    ) -> RequestStream:
        """Validate and queue a request now (errors raise here, before any iteration); must be
        called from a running event loop. Returns the stream of its outputs."""
        loop = asyncio.get_running_loop()
        request_id = request_id or uuid.uuid4().hex
        with self._cond:
            if self.dead is not None or self._stopping:
                raise EngineDeadError(f"engine is not running: {self.dead or 'shut down'}")
            stream = RequestStream(self, request_id, loop)
            self.engine.add_request(prompt, params, request_id=request_id, adapter=adapter, tenant_id=tenant_id,
                                    priority=priority, weight=weight, cache_salt=cache_salt)
            self._streams[request_id] = stream
            self._cond.notify_all()
        return stream

    async def generate(self, prompt, params=None, **kwargs) -> RequestOutput:
        """Submit and wait for the final output."""
        final = None
        async for out in self.submit(prompt, params, **kwargs):
            final = out
        return final

    def compile_structured(self, spec: StructuredOutputSpec) -> None:
        """Compile (and cache) a structured-output grammar WITHOUT the step lock: call it from a
        worker thread before ``submit`` so the request waits for its grammar and the batch does not."""
        self.engine.structured.compile(spec)

    def abort(self, request_id: str) -> bool:
        with self._cond:
            out = self.engine.abort_request(request_id)
            stream = self._streams.pop(request_id, None)
        if stream is not None and out is not None:
            stream._push(out)
        return out is not None

    # ------------------------------------------------------------------ admin (between steps)
    def _call(self, fn, *args, **kwargs) -> Any:
        with self._cond:
            return fn(*args, **kwargs)

    def add_adapter(self, name: str, path: str) -> None:
        self._call(self._lora().add_adapter, name, path)

    def remove_adapter(self, name: str) -> None:
        self._call(self._lora().remove_adapter, name)

    def list_adapters(self) -> list[str]:
        return self._call(self._lora().list_adapters) if self.engine.lora is not None else []

    def _lora(self):
        if self.engine.lora is None:
            raise RuntimeError("this engine was built without LoRA support")
        return self.engine.lora

    def set_tenant(self, tenant_id: str, priority: int | None = None, weight: float | None = None,
                   max_running_seqs: int | None | object = UNCHANGED) -> None:
        """Update a tenant's scheduling fields; ``max_running_seqs=None`` removes its own cap."""
        self._call(self.engine.set_tenant, tenant_id, priority=priority, weight=weight,
                   max_running_seqs=max_running_seqs)

    def stats(self) -> dict:
        return self._call(self.engine.stats)

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stopping and not self.engine.has_unfinished_requests():
                        self._cond.wait()
                    if self._stopping:
                        return
                    outputs = self.engine.step()
                    deliveries = []
                    for out in outputs:
                        stream = self._streams.get(out.request_id)
                        if stream is None:
                            continue
                        if out.finished:
                            self._streams.pop(out.request_id, None)
                        deliveries.append((stream, out))
                for stream, out in deliveries:
                    stream._push(out)
        except BaseException as exc:  # a bug in the loop: fail every stream, refuse new work
            log.exception("engine loop died")
            with self._cond:
                self.dead = exc
                streams, self._streams = self._streams, {}
            for stream in streams.values():
                stream._push(EngineDeadError(f"engine loop died: {exc!r}"))
