"""A request on the Serve engine deployment, seen from the ingress as an ``EngineStream``.

- ``open()`` waits until a replica accepted the request (a 4xx/404 from the replica surfaces there,
  before any byte of the response); ``replica`` names it.
- A replica that dies (or stops answering for ``chunk_timeout_s``, or whose engine loop died):
  the request is sent again, to another replica, from its checkpoint (``checkpoint.py``: the
  prompt plus the tokens this stream already handed out, which the engine continues from; what it
  repeats is dropped here), so the reader sees one uninterrupted stream, each token once. Only
  after ``MAX_LOSSES`` losses, or for n > 1 once a token was handed out, a 503 platform error,
  which the billing code turns into a clean error event billed for what was delivered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from loraplex.platform.cluster.checkpoint import StreamCheckpoint
from loraplex.platform.cluster.messages import Accepted, GenerateRequest, Output, StreamChunk, StreamError
from loraplex.platform.errors import PlatformError, ServiceUnavailable

if TYPE_CHECKING:
    from loraplex.engine import RequestOutput

log = logging.getLogger("loraplex.platform.cluster")

MAX_LOSSES = 4  # replicas a request may lose (each resumed from its checkpoint) before it fails


class ReplicaCall(Protocol):
    """Serve's streaming response to one call of the engine deployment (``generate``)."""

    def __anext__(self) -> Awaitable[StreamChunk]: ...

    def cancel(self) -> None: ...


# One call to the engine deployment: (request, multiplexed model id) -> Serve's streaming response.
CallFn = Callable[[GenerateRequest, str], ReplicaCall]


class RemoteStream:
    def __init__(
        self, call: CallFn, done: Callable[[str], None], req: GenerateRequest, adapter: str, timeout_s: float
    ) -> None:
        self._call_fn = call
        self._done = done
        self._req = req
        self._adapter = adapter
        self._timeout_s = timeout_s
        self._call: ReplicaCall | None = None
        self._sends = 0  # calls made: the request, then its resumptions
        self._losses = 0  # replicas lost (died, stalled, engine dead) while serving it
        self._ckpt = StreamCheckpoint(int(req.params.n), int(req.params.max_tokens))
        self._cancelled = False  # aborted by an operator or by the client going away
        self._abort_told = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.replica = ""

    async def open(self) -> None:
        """Wait for a replica to accept the request (another one if a replica is lost on the way)."""
        self._loop = asyncio.get_running_loop()
        await self._connect()

    async def _connect(self) -> None:
        """Send the request — again from its checkpoint after a loss — until a replica accepts it."""
        while not self._cancelled:
            self._call = self._call_fn(self._ckpt.request(self._req, self._sends), self._adapter)
            self._sends += 1
            try:
                first = await self._next()
            except _ReplicaLost as exc:
                self._drop_call()
                await self._lost(exc)  # raises when the request cannot go on
                continue
            except BaseException:
                self.close()
                raise
            if isinstance(first, Accepted):
                self.replica = first.replica
                return
            if isinstance(first, StreamError) and first.code == StreamError.ENGINE_UNAVAILABLE:
                # that replica's engine loop is dead (Serve's health check will replace it)
                self._drop_call()
                await self._lost(_ReplicaLost(first.message))
                continue
            self.close()
            raise _unexpected(first)

    async def _lost(self, exc: _ReplicaLost) -> None:
        """A replica was lost: wait a moment (Serve's router drops a dead replica when a call to it
        fails) and return to send again, or raise the 503 when the request cannot go on."""
        self._losses += 1
        why = self._ckpt.not_resumable()
        if why is None and self._losses >= MAX_LOSSES:
            why = f"{self._losses} replicas lost"
        if why is not None or self._cancelled:
            self.close()
            if self._ckpt.received:
                raise ServiceUnavailable(
                    f"generation on engine replica {self.replica} broke off: {exc} ({why})",
                    headers={"retry-after": "5"},
                ) from None
            raise ServiceUnavailable(
                f"no engine replica could take the request: {exc}", headers={"retry-after": "5"}
            ) from None
        log.warning(
            "request %s: %s after %d tokens; resuming on another replica",
            self._req.request_id,
            exc,
            self._ckpt.num_tokens(),
        )
        await asyncio.sleep(min(2.0, 0.1 * 2**self._losses))

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self

    async def __anext__(self) -> RequestOutput:
        while True:
            if self._cancelled:
                return self._aborted()
            if self._call is None:
                raise StopAsyncIteration
            try:
                chunk = await self._next()
            except StopAsyncIteration:
                self.close()
                raise
            except _ReplicaLost as exc:
                if self._cancelled:
                    return self._aborted()
                self._drop_call()
                if await self._resume(exc):
                    return self._finish_by_length()
                continue
            except BaseException:
                self.close()
                raise
            if not isinstance(chunk, Output):
                if isinstance(chunk, StreamError) and chunk.code == StreamError.ENGINE_UNAVAILABLE:
                    self._drop_call()  # the engine loop died under it
                    if await self._resume(_ReplicaLost(chunk.message)):
                        return self._finish_by_length()
                    continue
                self.close()
                raise _unexpected(chunk)
            out = self._ckpt.record(chunk.out, self._req.request_id)
            if out.finished:
                self._done(self._req.request_id)
            elif not any(c.token_ids or c.text or c.logprobs for c in out.outputs):
                continue  # all of it was replay the reader already has
            return out

    async def _resume(self, exc: _ReplicaLost) -> bool:
        """Continue on another replica from the checkpoint; True when the reader already holds
        every token (only the finish was lost)."""
        await self._lost(exc)
        if self._ckpt.complete():
            return True
        await self._connect()
        return False

    def _finish_by_length(self) -> RequestOutput:
        self.close()
        return self._ckpt.finished_by_length(self._req.request_id, self._req.prompt_ids)

    async def _next(self) -> StreamChunk:
        assert self._call is not None
        try:
            return await asyncio.wait_for(self._call.__anext__(), timeout=self._timeout_s)
        except StopAsyncIteration:
            raise
        except asyncio.TimeoutError:
            # which side stalled is not known here: the replica, or this ingress (a frozen process
            # finds every deadline passed when it resumes)
            raise _ReplicaLost(f"no chunk reached this ingress for {self._timeout_s:.0f} s") from None
        except (PlatformError, asyncio.CancelledError):
            raise
        except Exception as exc:
            if not type(exc).__module__.startswith("ray"):
                raise
            # RayActorError (replica died), ActorUnavailableError, Serve's BackPressureError...
            raise _ReplicaLost(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from None

    def cancel(self) -> None:
        """Abort (any thread): the replica's generator is cancelled and aborts in its engine; the
        caller reads one last output finished with reason ``abort``, as from a local engine."""
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is not None and running is not loop:
            loop.call_soon_threadsafe(self.cancel)
            return
        self._cancelled = True
        self._drop_call()

    def _aborted(self) -> RequestOutput:
        from loraplex.engine import CompletionOutput, FinishReason, RequestOutput

        if self._abort_told:
            raise StopAsyncIteration
        self._abort_told = True
        self._done(self._req.request_id)
        n = int(self._req.params.n)
        outs = [CompletionOutput(i, [], "", FinishReason.ABORT) for i in range(n)]
        return RequestOutput(self._req.request_id, self._req.prompt_ids, outs, True)

    def _drop_call(self) -> None:
        if self._call is not None:
            try:
                self._call.cancel()  # the replica's generator gets CancelledError and aborts
            except Exception:  # noqa: BLE001 - already finished or gone
                pass
            self._call = None

    def close(self) -> None:
        self._drop_call()
        self._done(self._req.request_id)

    async def aclose(self) -> None:
        self.close()


class _ReplicaLost(Exception):
    pass


def _unexpected(chunk: StreamChunk) -> PlatformError:
    """A replica's error as the same platform error here; anything else out of order is a 503."""
    if isinstance(chunk, StreamError):
        return chunk.error()
    return ServiceUnavailable(f"the engine replica answered out of order: {type(chunk).__name__}")
