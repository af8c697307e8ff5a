"""A request on the Serve engine deployment, seen from the ingress as an ``EngineStream``.

- ``open()`` waits until a replica accepted the request (a 4xx/404 from the replica surfaces there,
  before any byte of the response); ``replica`` names it.
- A replica that dies (or stops answering for ``chunk_timeout_s``) before the request streamed a
  token: the request is sent once more, to another replica. After a token: a 503 platform error,
  which the billing code turns into a clean error event billed for what was delivered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from loraplex.platform import errors
from loraplex.platform.errors import PlatformError, ServiceUnavailable

if TYPE_CHECKING:
    from loraplex.engine import RequestOutput

log = logging.getLogger("loraplex.platform.cluster")

# One call to the engine deployment: (request dict, multiplexed model id) -> Serve's streaming response.
CallFn = Callable[[dict[str, Any], str], Any]


class RemoteStream:
    def __init__(
        self, call: CallFn, done: Callable[[str], None], req: dict[str, Any], adapter: str, timeout_s: float
    ) -> None:
        self._call_fn = call
        self._done = done
        self._req = req
        self._adapter = adapter
        self._timeout_s = timeout_s
        self._call: Any = None
        self._attempts = 0
        self._streamed = False  # a token reached the caller: no retry from here on
        self._cancelled = False  # aborted by an operator or by the client going away
        self._abort_told = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.replica = ""

    async def open(self) -> None:
        """Wait for a replica to accept the request (retrying once on a dead replica)."""
        self._loop = asyncio.get_running_loop()
        while True:
            self._attempts += 1
            self._call = self._call_fn(self._req, self._adapter)
            try:
                first = await self._next()
            except _ReplicaLost as exc:
                self._drop_call()
                if self._attempts < 2 and not self._cancelled:
                    log.warning(
                        "request %s: %s before it started; retrying on another replica", self._req["request_id"], exc
                    )
                    continue
                self.close()
                raise ServiceUnavailable(
                    f"no engine replica could take the request: {exc}", headers={"retry-after": "5"}
                ) from None
            except BaseException:
                self.close()
                raise
            if "replica" in first:
                self.replica = first["replica"]
                return
            if first.get("code") == "engine_unavailable" and self._attempts < 2 and not self._cancelled:
                # that replica's engine loop is dead (Serve's health check will replace it)
                self._drop_call()
                continue
            self.close()
            _raise_chunk_error(first)

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self

    async def __anext__(self) -> RequestOutput:
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
            if not self._streamed and self._attempts < 2 and not self._cancelled:
                log.warning(
                    "request %s: %s before its first token; retrying on another replica", self._req["request_id"], exc
                )
                await self.open()  # raises 503 if that fails too
                return await self.__anext__()
            self.close()
            raise ServiceUnavailable(
                f"generation on engine replica {self.replica} broke off: {exc}", headers={"retry-after": "5"}
            ) from None
        except BaseException:
            self.close()
            raise
        if "error_class" in chunk:
            self.close()
            _raise_chunk_error(chunk)
        out: RequestOutput = chunk["out"]
        if any(len(c.token_ids) for c in out.outputs):
            self._streamed = True
        if out.finished:
            self._done(self._req["request_id"])
        return out

    async def _next(self) -> dict[str, Any]:
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
        self._done(self._req["request_id"])
        n = int(self._req["params"].n)
        outs = [CompletionOutput(i, [], "", FinishReason.ABORT) for i in range(n)]
        return RequestOutput(self._req["request_id"], self._req["prompt_ids"], outs, True)

    def _drop_call(self) -> None:
        if self._call is not None:
            try:
                self._call.cancel()  # the replica's generator gets CancelledError and aborts
            except Exception:  # noqa: BLE001 - already finished or gone
                pass
            self._call = None

    def close(self) -> None:
        self._drop_call()
        self._done(self._req["request_id"])

    async def aclose(self) -> None:
        self.close()


class _ReplicaLost(Exception):
    pass


def _raise_chunk_error(chunk: dict[str, Any]) -> None:
    cls = getattr(errors, chunk.get("error_class", ""), None)
    if not (isinstance(cls, type) and issubclass(cls, PlatformError)):
        cls = ServiceUnavailable
    exc = cls(chunk["message"], param=chunk.get("param"), code=chunk.get("code"), headers=chunk.get("headers"))
    raise exc
