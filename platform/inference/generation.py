"""One admitted request through the engine, billed exactly once.

``start_all`` (``start`` per prompt) submits to the engine (its validation errors are still HTTP 4xx, and give the quota
reservation back) and makes the usage record durable before any byte of the response. ``Generation``
then yields per-choice deltas (``deltas.py``: the engine's DELTA outputs, only what is new), checkpoints the
token count of long streams, enforces the generation timeout, and makes the final record durable
before the last deltas are handed out. Whatever ends the request (finish, client gone, admin abort,
timeout, engine death) settles the quota reservation to the tokens actually delivered. A
non-streaming client that disconnects aborts its sequences (``disconnect``) and is billed for what
was generated up to the abort."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from loraplex.platform.engine_client import EngineStream
from loraplex.platform.errors import PlatformError, ServiceUnavailable
from loraplex.platform.inference import disconnect
from loraplex.platform.inference.admission import Prepared
from loraplex.platform.inference.deltas import (
    Delta,
    cached_tokens,
    choice_deltas,
    is_abort,
    new_tokens,
    timeout_deltas,
)
from loraplex.platform.observability.metrics import FinishedRequest
from loraplex.platform.projects.scope import fair_group

if TYPE_CHECKING:
    from loraplex.platform.context import PlatformContext

log = logging.getLogger("loraplex.platform.inference")

__all__ = ["ClientGone", "Delta", "Generation", "Prepared", "RequestCancelled", "merge_deltas", "start", "start_all"]


CLIENT_GONE = "the client disconnected"


class ClientGone(PlatformError):
    """A non-streaming client disconnected; nobody reads this answer (nginx's 499)."""

    status_code = 499
    type = "invalid_request_error"
    code = "client_closed_request"


class RequestCancelled(PlatformError):
    """An operator stopped the request mid-flight (tenant suspended/deleted, key revoked, adapter deleted)."""

    status_code = 409
    type = "invalid_request_error"
    code = "request_cancelled"


async def start_all(ctx: PlatformContext, preps: list[Prepared], *, streaming: bool) -> list[Generation]:
    """Submit every prompt's request (4xx/503 here, before any byte of the response); if one is
    refused, end the started ones and give the rest's reservations back."""
    gens: list[Generation] = []
    try:
        for p in preps:
            gens.append(await start(ctx, p, streaming=streaming))
    except BaseException:
        for g in gens:
            ctx.engine.abort(g.prep.request_id)
            g.finish("error")
        for p in preps[len(gens) + 1 :]:  # the refused one gave its own back (start)
            ctx.quotas.cancel(p.reservation)
            ctx.budgets.release(p.budget)
        raise
    return gens


async def start(ctx: PlatformContext, prep: Prepared, *, streaming: bool) -> Generation:
    try:
        stream = ctx.engine.submit(
            prep.prompt_ids,
            prep.params,
            request_id=prep.request_id,
            adapter=prep.adapter_id,
            tenant_id=prep.auth.tenant_id,
            cache_salt=prep.auth.tenant_id,
            fair_group=fair_group(prep.auth.project),
        )
        await stream.open()  # a remote engine (Ray Serve): until a replica accepted it
    except BaseException as exc:
        ctx.quotas.cancel(prep.reservation)
        ctx.budgets.release(prep.budget)
        if isinstance(exc, PlatformError) or not isinstance(exc, Exception):
            raise  # the engine already maps engine errors (4xx for bad requests, 503 for a dead engine)
        raise ServiceUnavailable(f"the engine cannot take requests: {exc}", headers={"retry-after": "5"}) from None
    gen = Generation(ctx, prep, stream, streaming)
    ctx.inflight.add(prep.request_id, prep.auth.tenant_id, prep.auth.key_id, prep.adapter_id)
    watch = disconnect.current()
    if watch is not None and not streaming:  # a stream notices the disconnect itself
        watch.on_gone(gen.client_left)
    try:
        await gen.durable(gen.record("running"))
    except BaseException:
        gen.finish("error")
        raise
    return gen


class Generation:
    def __init__(self, ctx: PlatformContext, prep: Prepared, stream: EngineStream, streaming: bool) -> None:
        self.ctx = ctx
        self.streaming = streaming
        self.prep = prep
        self._stream = stream
        self.delivered = 0  # completion tokens (all choices) handed to the response
        self.cached = 0  # prompt tokens served from the prefix cache (priced at the cached rate)
        self.first_token_at: float | None = None
        self.client_gone = False  # a non-streaming client left: bill what was generated
        self._closed = False
        self._ended = False

    @property
    def replica(self) -> str:
        """x-loraplex-replica: the engine replica serving it (a remote stream knows it once opened)."""
        return self._stream.replica or self.ctx.engine.replica_name

    async def durable(self, written: Any) -> None:
        if self.ctx.settings.ledger.durable:
            await asyncio.wrap_future(written)

    def record(self, status: str) -> Any:
        """Write this request's record as it stands (a future: durable when resolved)."""
        p = self.prep
        now = time.monotonic()
        return self.ctx.ledger.write(
            request_id=p.request_id,
            http_request_id=p.http_request_id,
            tenant_id=p.auth.tenant_id,
            api_key_id=p.auth.key_id,
            project_id=p.auth.project.project_id if p.auth.project else None,
            adapter_id=p.adapter_id,
            adapter_name=p.model if p.adapter_id else None,
            endpoint=p.endpoint,
            user=p.user[:256] if p.user else None,
            prompt_tokens=len(p.prompt_ids),
            cached_tokens=self.cached,
            base_model=self.ctx.engine.model_name or None,
            completion_tokens=self.delivered,
            reserved_tokens=p.reservation.tokens,  # other servers count it until it ends (quotas)
            ttft_ms=(self.first_token_at - p.started) * 1000 if self.first_token_at else None,
            latency_ms=(now - p.started) * 1000,
            status=status,
        )

    def finish(self, status: str) -> Any:
        """Settle the quota, drop the in-flight entry and write the final record (once)."""
        if self._closed:
            return None
        self._closed = True
        if not self.streaming and status in ("aborted", "error") and not self.client_gone:
            self.delivered = 0  # a refused non-streaming response carried no text
        p = self.prep
        self.ctx.inflight.remove(p.request_id)
        self.ctx.quotas.settle(p.reservation, len(p.prompt_ids) + self.delivered)
        # its budget in currency: the cost of what was served, cached prompt tokens at the cached price
        self.ctx.budgets.settle(p.budget, len(p.prompt_ids), self.cached, self.delivered)
        now = time.monotonic()
        self.ctx.observer.finished(
            FinishedRequest(
                request_id=p.request_id,
                endpoint=p.endpoint,
                status=status,
                tenant_id=p.auth.tenant_id,
                adapter=p.model if p.adapter_id else None,
                prompt_tokens=len(p.prompt_ids),
                completion_tokens=self.delivered,
                ttft_s=(self.first_token_at - p.started) if self.first_token_at else None,
                latency_s=now - p.started,
                admission_s=p.admission_s,
                user=p.user,
                start_unix=time.time() - (now - p.started),
                http_request_id=p.http_request_id,
            )
        )
        return self.record(status)

    def client_left(self) -> None:
        """The client of a non-streaming request disconnected: stop its sequences now."""
        if self._closed:
            return
        self.client_gone = True
        self.ctx.inflight.mark(self.prep.request_id, CLIENT_GONE)
        self.ctx.engine.abort(self.prep.request_id)

    async def deltas(self) -> AsyncIterator[Delta]:
        """Per-choice deltas; those with a finish_reason come after the final record is durable."""
        prep = self.prep
        checkpoints = _Checkpoints(self.ctx.settings.ledger.checkpoint_interval_s)
        deadline = prep.started + prep.timeout_s
        done: set[int] = set()
        self._ended = False
        try:
            while True:
                out = await self._next_output(deadline)
                if out is None:  # the generation timeout: ended and billed
                    for d in timeout_deltas(prep.params.n, done, self.delivered):
                        yield d
                    return
                if is_abort(out):
                    self._aborted()  # raises
                self.delivered += new_tokens(out)
                self.cached = max(self.cached, cached_tokens(out, len(prep.prompt_ids)))
                if self.delivered and self.first_token_at is None:
                    self.first_token_at = time.monotonic()
                pending = choice_deltas(out, done, self.delivered)
                if out.finished:
                    self._ended = True
                    await self.durable(self.finish("ok"))  # billed before the last bytes leave
                    for d in pending:
                        yield d
                    return
                for d in pending:
                    yield d
                if checkpoints.due():
                    self.record("running")  # not awaited: a checkpoint must not slow the stream
        finally:
            if not self._ended:  # client gone, engine error, cancellation: stop and bill what was sent
                self.ctx.engine.abort(prep.request_id)
                self.finish("aborted" if not isinstance(sys.exc_info()[1], PlatformError) else "error")

    async def _next_output(self, deadline: float) -> Any:
        """The engine's next output, or None once the generation timeout ended (and billed) it."""
        try:
            left = deadline - time.monotonic()
            out = await asyncio.wait_for(self._stream.__anext__(), timeout=max(left, 0.001))
        except StopAsyncIteration:
            raise ServiceUnavailable("the engine ended the request without a result") from None
        except asyncio.TimeoutError:
            self.ctx.engine.abort(self.prep.request_id)
            self._ended = True
            await self.durable(self.finish("timeout"))
            return None
        except PlatformError:
            raise
        except Exception as exc:  # the engine died under this request
            raise ServiceUnavailable(f"generation failed: {exc}", headers={"retry-after": "5"}) from None
        if out.error:
            raise ServiceUnavailable(f"generation failed: {out.error}", headers={"retry-after": "5"})
        return out

    def _aborted(self) -> None:
        """The engine aborted the request: its client left, or an operator stopped it."""
        reason = self.ctx.inflight.reason(self.prep.request_id) or "the request was aborted"
        self._ended = True
        self.finish("aborted")
        if reason == CLIENT_GONE:
            raise ClientGone("the client disconnected")
        raise RequestCancelled(f"the request was stopped: {reason}")


class _Checkpoints:
    """When a long stream's running record is next written (a crash bills it up to there)."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.last = time.monotonic()

    def due(self) -> bool:
        now = time.monotonic()
        if now - self.last < self.every_s:
            return False
        self.last = now
        return True


async def merge_deltas(gens: list[AsyncIterator[Delta]]) -> AsyncIterator[tuple[int, Delta]]:
    """Interleave the prompts' delta streams as (prompt index, delta); closing this closes (and so
    aborts and bills) all of them."""
    if len(gens) == 1:
        try:
            async for d in gens[0]:
                yield 0, d
        finally:
            await gens[0].aclose()  # type: ignore[attr-defined]
        return
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(k: int, gen: AsyncIterator[Delta]) -> None:
        try:
            async for d in gen:
                await queue.put((k, d))
            await queue.put((k, end))
        except Exception as exc:  # re-raised in the consumer
            await queue.put((k, exc))

    tasks = [asyncio.create_task(pump(k, g)) for k, g in enumerate(gens)]
    try:
        live = len(gens)
        while live:
            k, item = await queue.get()
            if item is end:
                live -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield k, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for g in gens:
            await g.aclose()  # type: ignore[attr-defined]
