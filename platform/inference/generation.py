"""One admitted request through the engine, billed exactly once.

``start`` submits to the engine (its validation errors are still HTTP 4xx, and give the quota
reservation back) and makes the usage record durable before any byte of the response. ``Generation``
then yields text deltas, checkpoints the token count of long streams, enforces the generation
timeout, and makes the final record durable before the last delta is handed out. Whatever ends the
request (finish, client gone, admin abort, timeout, engine death) settles the quota reservation to
the tokens actually delivered."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from loraplex.platform.errors import BadRequest, PlatformError, ServiceUnavailable
from loraplex.platform.inference.admission import Prepared

log = logging.getLogger("loraplex.platform.inference")


@dataclass
class Delta:
    text: str
    finish_reason: str | None
    completion_tokens: int


class RequestCancelled(PlatformError):
    """An operator stopped the request mid-flight (tenant suspended/deleted, key revoked, adapter deleted)."""

    status_code = 409
    type = "invalid_request_error"
    code = "request_cancelled"


async def start(ctx, prep: Prepared, *, streaming: bool) -> Generation:
    try:
        stream = ctx.gateway.submit(
            prep.prompt_ids, prep.params, request_id=prep.request_id, adapter=prep.adapter_id,
            tenant_id=prep.auth.tenant_id, cache_salt=prep.auth.tenant_id,
        )
        opened = getattr(stream, "open", None)
        if opened is not None:  # a remote engine (Ray Serve): wait until a replica accepted it
            await opened()
    except BaseException as exc:
        ctx.quotas.cancel(prep.reservation)
        if isinstance(exc, ValueError):  # the engine's InvalidRequestError: context length, token ids...
            raise BadRequest(str(exc), param=getattr(exc, "param", None)) from None
        if isinstance(exc, PlatformError):
            raise
        if isinstance(exc, Exception):  # EngineDeadError and friends: the engine cannot take work
            raise ServiceUnavailable(f"the engine cannot take requests: {exc}",
                                     headers={"retry-after": "5"}) from None
        raise
    gen = Generation(ctx, prep, stream, streaming)
    ctx.inflight.add(prep.request_id, prep.auth.tenant_id, prep.auth.key_id, prep.adapter_id)
    try:
        await gen.durable(gen.record("running"))
    except BaseException:
        gen.finish("error")
        raise
    return gen


class Generation:
    def __init__(self, ctx, prep: Prepared, stream, streaming: bool) -> None:
        self.ctx = ctx
        self.streaming = streaming
        self.prep = prep
        self._stream = stream
        self.delivered = 0  # completion tokens handed to the response
        self.first_token_at: float | None = None
        self._closed = False

    @property
    def replica(self) -> str:
        """x-loraplex-replica: the engine replica serving it (a remote stream knows it once opened)."""
        return getattr(self._stream, "replica", "") or self.ctx.gateway.replica_name

    async def durable(self, written) -> None:
        if self.ctx.settings.ledger.durable:
            await asyncio.wrap_future(written)

    def record(self, status: str):
        """Write this request's record as it stands (a future: durable when resolved)."""
        p = self.prep
        now = time.monotonic()
        return self.ctx.ledger.write(
            request_id=p.request_id, tenant_id=p.auth.tenant_id, api_key_id=p.auth.key_id,
            adapter_id=p.adapter_id, adapter_name=p.model if p.adapter_id else None, endpoint=p.endpoint,
            prompt_tokens=len(p.prompt_ids), completion_tokens=self.delivered,
            ttft_ms=(self.first_token_at - p.started) * 1000 if self.first_token_at else None,
            latency_ms=(now - p.started) * 1000, status=status,
        )

    def finish(self, status: str):
        """Settle the quota, drop the in-flight entry and write the final record (once)."""
        if self._closed:
            return None
        self._closed = True
        if not self.streaming and status in ("aborted", "error"):
            self.delivered = 0  # a refused non-streaming response carried no text
        self.ctx.inflight.remove(self.prep.request_id)
        self.ctx.quotas.settle(self.prep.reservation, len(self.prep.prompt_ids) + self.delivered)
        return self.record(status)

    async def deltas(self) -> AsyncIterator[Delta]:
        """Text deltas; the one with a finish_reason comes after the final record is durable."""
        prep, ctx = self.prep, self.ctx
        checkpoint_every = ctx.settings.ledger.checkpoint_interval_s
        last_checkpoint = time.monotonic()
        deadline = prep.started + prep.timeout_s
        ended = False
        try:
            while True:
                left = deadline - time.monotonic()
                try:
                    out = await asyncio.wait_for(self._stream.__anext__(), timeout=max(left, 0.001))
                except StopAsyncIteration:
                    raise ServiceUnavailable("the engine ended the request without a result") from None
                except asyncio.TimeoutError:
                    ctx.gateway.abort(prep.request_id)
                    ended = True
                    await self.durable(self.finish("timeout"))
                    yield Delta("", "length", self.delivered)  # documented: timeout reads as "length"
                    return
                except Exception as exc:  # the engine died under this request (EngineDeadError)
                    raise ServiceUnavailable(f"generation failed: {exc}", headers={"retry-after": "5"}) from None
                if out.error:
                    raise ServiceUnavailable(f"generation failed: {out.error}", headers={"retry-after": "5"})
                comp = out.outputs[0]
                if out.finished and comp.finish_reason == "abort":
                    reason = ctx.inflight.reason(prep.request_id) or "the request was aborted"
                    ended = True
                    self.finish("aborted")
                    raise RequestCancelled(f"the request was stopped: {reason}")
                if len(comp.token_ids) and self.first_token_at is None:
                    self.first_token_at = time.monotonic()
                delta_text = comp.text  # DELTA outputs: only what is new since the previous one
                self.delivered += len(comp.token_ids)
                if out.finished:
                    ended = True
                    await self.durable(self.finish("ok"))
                    yield Delta(delta_text, str(comp.finish_reason) if comp.finish_reason else None, self.delivered)
                    return
                if delta_text:
                    yield Delta(delta_text, None, self.delivered)
                if time.monotonic() - last_checkpoint >= checkpoint_every:
                    last_checkpoint = time.monotonic()
                    self.record("running")  # not awaited: a checkpoint must not slow the stream
        finally:
            if not ended:  # client gone, engine error, cancellation: stop and bill what was sent
                ctx.gateway.abort(prep.request_id)
                self.finish("aborted" if not isinstance(_current_error(), PlatformError) else "error")


def _current_error() -> BaseException | None:
    import sys

    return sys.exc_info()[1]
