"""AsyncEngine: the step loop on its own thread, requests as async iterators (for servers).

    engine = AsyncEngine(EngineConfig(model=...)).start()
    async for out in engine.submit(EngineRequest(prompt_ids, SamplingParams(max_tokens=64), tenant_id="acme")):
        ...   # RequestOutput after every step that changed it; the last has finished=True
    engine.shutdown()

The engine thread alone touches the ``LLMEngine``. Callers never wait on a step: ``submit`` validates
on the caller's thread (a bad request raises there, before any iteration) and puts the request in an
inbox; ``abort`` and admin calls go through the same inbox, which the engine thread drains between
two steps, so an admin change affects the very next step. Outputs travel back through each stream's
asyncio queue (``call_soon_threadsafe``); with ``OutputKind.DELTA`` a stream that fell behind
coalesces what queued up instead of dropping it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .config import EngineConfig
from .errors import EngineDeadError, InvalidRequestError
from .llm_engine import UNCHANGED, LLMEngine
from .outputs import OutputKind, RequestOutput
from .request import EngineRequest
from .sampling_params import SamplingParams, StructuredOutputSpec
from .torch_threads import mark_long_lived

log = logging.getLogger("loraplex.engine")
T = TypeVar("T")
# Admin calls wait at most this long for the engine thread (a step is milliseconds to seconds).
CALL_TIMEOUT_S = 120.0


class RequestStream:
    """Async iterator over one request's outputs. Closing it early aborts the request."""

    def __init__(self, engine: AsyncEngine, request_id: str, loop: asyncio.AbstractEventLoop):
        self.request_id = request_id
        self._engine = engine
        self._loop = loop
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.finished = False

    def _push(self, item: RequestOutput | BaseException) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed: nobody is listening any more
            pass

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        while True:
            if isinstance(item, BaseException):
                self.finished = True
                raise item
            if item.finished or self._queue.empty():
                break
            # Several steps queued up: cumulative outputs supersede, deltas add up.
            nxt = self._queue.get_nowait()
            if isinstance(nxt, RequestOutput) and item.kind is OutputKind.DELTA:
                item.merge(nxt)
            else:
                item = nxt
        if item.finished:
            self.finished = True
        return item

    async def aclose(self) -> None:
        if not self.finished:
            self.finished = True
            self._engine.abort(self.request_id)

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@dataclass
class _Add:
    request: EngineRequest
    stream: RequestStream


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Call:
    fn: Callable[[], Any]
    future: concurrent.futures.Future


class InjectedFault(RuntimeError):
    """Raised inside the engine loop by ``AsyncEngine.inject_fault`` (fault tests)."""


@dataclass
class _Fault:
    message: str


class AsyncEngine:
    def __init__(self, config: EngineConfig | None = None, *, engine: LLMEngine | None = None):
        if engine is None:
            if config is None:
                raise ValueError("AsyncEngine needs an EngineConfig or an LLMEngine")
            engine = LLMEngine(config)
        self.engine = engine
        self._inbox: queue.SimpleQueue[_Add | _Abort | _Call | _Fault | None] = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}  # request id -> stream, guarded by _streams_lock
        self._streams_lock = threading.Lock()  # held for dict operations only, never across a step
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.dead: BaseException | None = None

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> AsyncEngine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="loraplex-engine", daemon=True)
            self._thread.start()
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        # The loop is gone: this thread may touch the engine now.
        with self._streams_lock:
            streams, self._streams = self._streams, {}
        for rid, stream in streams.items():
            out = self.engine.abort_request(rid)
            stream._push(out if out is not None else EngineDeadError("engine shut down"))

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.dead is None

    # ------------------------------------------------------------------ requests
    def submit(
        self, request: EngineRequest | str | list[int], params: SamplingParams | None = None, **fields: Any
    ) -> RequestStream:
        """Validate and queue a request (an ``EngineRequest``, or its fields). Bad requests raise
        here, on the caller's thread, before any iteration; must be called from a running event
        loop. Never waits for the engine's step."""
        if not isinstance(request, EngineRequest):
            request = EngineRequest(request, params or SamplingParams(), **fields)
        elif params is not None or fields:
            raise TypeError("pass either an EngineRequest or its fields, not both")
        loop = asyncio.get_running_loop()
        if self.dead is not None or self._stopping:
            raise EngineDeadError(f"engine is not running: {self.dead or 'shut down'}")
        token_ids, _adapter = self.engine.validate(request)
        if not isinstance(request.prompt, list):
            request.prompt = token_ids  # tokenized once, here
        stream = RequestStream(self, request.request_id, loop)
        with self._streams_lock:
            if request.request_id in self._streams:
                raise InvalidRequestError(f"request id {request.request_id!r} is already in use", param="request_id")
            self._streams[request.request_id] = stream
        self._inbox.put(_Add(request, stream))
        return stream

    async def generate(
        self, request: EngineRequest | str | list[int], params: SamplingParams | None = None, **fields: Any
    ) -> RequestOutput:
        """Submit and wait for the final output."""
        final = None
        async for out in self.submit(request, params, **fields):
            final = out
        assert final is not None
        return final

    def compile_structured(self, spec: StructuredOutputSpec) -> None:
        """Compile (and cache) a structured-output grammar on the caller's thread: call it from a
        worker thread before ``submit`` so the request waits for its grammar and neither the event
        loop nor the batch does (``submit``'s validation then finds it in the cache)."""
        self.engine.structured.compile(spec)

    def abort(self, request_id: str) -> bool:
        """Abort a request between two steps; its stream then ends with finish_reason "abort".
        False if no such request is in flight."""
        with self._streams_lock:
            known = request_id in self._streams
        if known:
            self._inbox.put(_Abort(request_id))
        return known

    def inject_fault(self, message: str = "fault injected by request") -> None:
        """Make the engine loop die between two steps exactly as a bug in a step would (the same
        ``except`` in ``_run``): every stream fails, new work is refused, ``is_running`` turns False.
        For fault tests of whatever supervises the engine; servers expose it only behind a debug
        setting."""
        self._inbox.put(_Fault(message))

    # ------------------------------------------------------------------ admin (between steps)
    def _call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the engine thread between two steps and wait for its result (directly,
        when no loop runs). Call from a worker thread, not from an event loop."""
        if self._thread is None or threading.current_thread() is self._thread:
            return fn()
        if not self.is_running:
            raise EngineDeadError(f"engine is not running: {self.dead or 'shut down'}")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._inbox.put(_Call(fn, future))
        return future.result(timeout=CALL_TIMEOUT_S)

    def add_adapter(self, name: str, path: str) -> None:
        lora = self.engine.lora
        loaded = lora.load(name, path)  # the slow part, on this thread
        self._call(lambda: lora.register(name, Path(path), loaded))

    def remove_adapter(self, name: str) -> None:
        self._call(lambda: self.engine.lora.remove_adapter(name))

    def list_adapters(self) -> list[str]:
        return self._call(self.engine.lora.list_adapters)

    def set_tenant(
        self,
        tenant_id: str,
        priority: int | None = None,
        weight: float | None = None,
        max_running_seqs: int | None = UNCHANGED,
    ) -> None:
        """Update a tenant's scheduling fields; ``max_running_seqs=None`` removes its own cap."""
        self._call(
            lambda: self.engine.set_tenant(
                tenant_id, priority=priority, weight=weight, max_running_seqs=max_running_seqs
            )
        )

    def stats(self) -> dict:
        return self._call(self.engine.stats)

    def exchange_fair_service(self, external: dict[str, float]) -> dict[str, float]:
        """Charge the fair policy with service other engines gave these tenants (weight-normalised
        units, since the previous call) and return this engine's own cumulative service per
        tenant: the two halves of fairness across replicas, in one call between two steps."""
        policy = self.engine.policy

        def exchange() -> dict[str, float]:
            policy.add_external_service(external)
            return policy.local_service()

        return self._call(exchange)

    # ------------------------------------------------------------------ the loop
    def _drain(self, block: bool) -> None:
        """Apply everything in the inbox; with ``block``, wait for the first item."""
        try:
            item = self._inbox.get() if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _apply(self, item: _Add | _Abort | _Call | _Fault | None) -> None:
        if item is None:
            return  # shutdown's wake-up
        if isinstance(item, _Fault):
            raise InjectedFault(item.message)
        if isinstance(item, _Add):
            try:
                self.engine.add_request(item.request)
            except Exception as exc:  # e.g. its adapter was removed since submit
                self._pop_stream(item.request.request_id)
                item.stream._push(exc)
        elif isinstance(item, _Abort):
            out = self.engine.abort_request(item.request_id)
            stream = self._pop_stream(item.request_id)
            if stream is not None and out is not None:
                stream._push(out)
        elif item.future.set_running_or_notify_cancel():
            try:
                item.future.set_result(item.fn())
            except BaseException as exc:
                item.future.set_exception(exc)

    def _pop_stream(self, request_id: str) -> RequestStream | None:
        with self._streams_lock:
            return self._streams.pop(request_id, None)

    def _run(self) -> None:
        mark_long_lived()  # torch work this thread starts (adapter loads) runs here, not on a pool
        try:
            while not self._stopping:
                self._drain(block=not self.engine.has_unfinished_requests())
                if self._stopping or not self.engine.has_unfinished_requests():
                    continue
                for out in self.engine.step():
                    with self._streams_lock:
                        stream = (
                            self._streams.pop(out.request_id, None)
                            if out.finished
                            else self._streams.get(out.request_id)
                        )
                    if stream is not None:
                        stream._push(out)
        except BaseException as exc:  # a bug in the loop: fail every stream, refuse new work
            log.exception("engine loop died")
            self.dead = exc
            with self._streams_lock:
                streams, self._streams = self._streams, {}
            for stream in streams.values():
                stream._push(EngineDeadError(f"engine loop died: {exc!r}"))
            self._fail_pending_calls(exc)

    def _fail_pending_calls(self, exc: BaseException) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Call) and item.future.set_running_or_notify_cancel():
                item.future.set_exception(EngineDeadError(f"engine loop died: {exc!r}"))
            elif isinstance(item, _Add):
                item.stream._push(EngineDeadError(f"engine loop died: {exc!r}"))
