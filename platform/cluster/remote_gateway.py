"""The ingress side of the scale-out: an ``EngineGateway`` whose engine is the Serve engine
deployment. Same calls as the local gateway, so admission, billing and the admin API run unchanged.

- ``submit`` returns a ``RemoteStream``: ``open()`` waits until a replica accepted the request (a
  4xx/404 from the replica surfaces there, before any byte of the response), ``replica`` names it.
- A replica that dies (or stops answering for ``chunk_timeout_s``) before the request streamed a
  token: the request is sent once more, to another replica. After a token: a 503 platform error,
  which the billing code turns into a clean error event billed for what was delivered.
- Tenant and adapter changes go to the control-plane actor (which every replica pulls from); the
  version each request was admitted under travels with it, so no replica serves it on older state.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from loraplex.platform import errors
from loraplex.platform.engine_gateway import EngineGateway
from loraplex.platform.errors import PlatformError, ServiceUnavailable
from loraplex.platform.settings import Settings

log = logging.getLogger("loraplex.platform.cluster")


class RemoteEngineGateway(EngineGateway):
    def __init__(self, settings: Settings, engine_handle: Any, control: Any, model_dir: Path) -> None:
        super().__init__(None, model_dir, settings.engine.max_lora_rank)
        self._handle = engine_handle
        self._control = control
        self._chunk_timeout_s = settings.cluster.chunk_timeout_s
        self._affinity = settings.cluster.routing == "affinity"
        self._version = 0
        self._live: dict[str, RemoteStream] = {}
        self._tokenizer: Any = None
        self._tokenizer_path = getattr(settings.engine, "tokenizer", None)
        # Loaded now, at the ingress's start: a lazy first load from several request threads at
        # once races inside transformers' lazy imports ("cannot import name AutoTokenizer").
        _ = self.tokenizer

    # -- what the platform reads --------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return True

    @property
    def alive(self) -> bool:
        try:
            return any(r.get("running", True) for r in self._replicas())
        except Exception:  # noqa: BLE001 - no control plane, nothing is alive
            return False

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from loraplex.engine.tokenizer import load_tokenizer  # the engine's own loader: same ids

            self._tokenizer = load_tokenizer(self._tokenizer_path or str(self.model_dir))
        return self._tokenizer

    def max_prompt_chars(self) -> int | None:
        if self._max_prompt_chars is None:
            lens = [int(r["max_model_len"]) for r in self._replicas() if "max_model_len" in r]
            if lens:
                longest = max((len(t) for t in self.tokenizer.get_vocab()), default=1)
                self._max_prompt_chars = min(lens) * max(longest, 1)
        return self._max_prompt_chars

    def shutdown(self) -> None:  # the replicas belong to Serve
        for stream in list(self._live.values()):
            stream.cancel()

    def _get(self, ref: Any, timeout: float = 10.0) -> Any:
        import ray

        try:
            return ray.get(ref, timeout=timeout)
        except Exception as exc:
            raise ServiceUnavailable(
                f"the cluster control plane is unavailable: {type(exc).__name__}", headers={"retry-after": "5"}
            ) from None

    def _replicas(self) -> list[dict[str, Any]]:
        return list(self._get(self._control.replicas.remote()))

    # -- tenants and adapters: into the control plane, pulled by every replica ---------------
    def set_tenant(self, tenant_id: str, priority: int, weight: float, max_running_seqs: int | None) -> None:
        self._version = max(
            self._version, self._get(self._control.set_tenant.remote(tenant_id, priority, weight, max_running_seqs))
        )

    def add_adapter(self, key: str, path: Path) -> None:
        with self._lock:
            self._version = max(self._version, self._get(self._control.add_adapter.remote(key, str(path))))
            self._adapters[key] = str(path)

    def remove_adapter(self, key: str) -> None:
        with self._lock:
            self._adapters.pop(key, None)
            self._version = max(self._version, self._get(self._control.remove_adapter.remote(key)))

    def stats(self) -> dict[str, Any]:
        replicas = self._replicas()
        first = replicas[0] if replicas else {}
        return {
            "enabled": True,
            "model": self.model_name,
            "mode": "ray-serve",
            **first,
            "replica_count": len(replicas),
            "replicas": replicas,
        }

    # -- generation --------------------------------------------------------------------------
    def submit(
        self,
        prompt_token_ids: list[int],
        params: Any,
        *,
        request_id: str,
        adapter: str | None,
        tenant_id: str,
        cache_salt: str | None,
    ) -> RemoteStream:
        req = {
            "prompt_ids": list(prompt_token_ids),
            "params": params,
            "request_id": request_id,
            "tenant_id": tenant_id,
            "cache_salt": cache_salt,
            "version": self._version,
        }
        req["adapter"] = adapter  # with affinity routing it also travels as the multiplexed model id
        stream = RemoteStream(self, req, (adapter or "") if self._affinity else "", self._chunk_timeout_s)
        self._live[request_id] = stream
        return stream

    def abort(self, request_id: str) -> None:
        stream = self._live.get(request_id)
        if stream is not None:
            stream.cancel()

    def _done(self, request_id: str) -> None:
        self._live.pop(request_id, None)

    def _call(self, req: dict[str, Any], adapter: str) -> Any:
        return self._handle.options(stream=True, multiplexed_model_id=adapter).generate.remote(req)


class RemoteStream:
    def __init__(self, gateway: RemoteEngineGateway, req: dict[str, Any], adapter: str, timeout_s: float) -> None:
        self._gw = gateway
        self._req = req
        self._adapter = adapter
        self._timeout_s = timeout_s
        self._call: Any = None
        self._attempts = 0
        self._streamed = False  # a token reached the caller: no retry from here on
        self._cancelled = False
        self.replica = ""

    async def open(self) -> None:
        """Wait for a replica to accept the request (retrying once on a dead replica)."""
        while True:
            self._attempts += 1
            self._call = self._gw._call(self._req, self._adapter)
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

    def __aiter__(self) -> RemoteStream:
        return self

    async def __anext__(self) -> Any:
        if self._call is None:
            raise StopAsyncIteration
        try:
            chunk = await self._next()
        except StopAsyncIteration:
            self.close()
            raise
        except _ReplicaLost as exc:
            self._drop_call()
            if not self._streamed and self._attempts < 2 and not self._cancelled:
                log.warning(
                    "request %s: %s before its first token; retrying on another replica", self._req["request_id"], exc
                )
                await self.open()  # raises 503 if that fails too
                return await self.__anext__()
            self.close()
            raise ServiceUnavailable(
                f"the engine replica {self.replica} failed mid-generation: {exc}", headers={"retry-after": "5"}
            ) from None
        except BaseException:
            self.close()
            raise
        if "error_class" in chunk:
            self.close()
            _raise_chunk_error(chunk)
        out = chunk["out"]
        if any(len(c.token_ids) for c in out.outputs):
            self._streamed = True
        if out.finished:
            self._gw._done(self._req["request_id"])
        return out

    async def _next(self) -> dict[str, Any]:
        try:
            return await asyncio.wait_for(self._call.__anext__(), timeout=self._timeout_s)
        except StopAsyncIteration:
            raise
        except asyncio.TimeoutError:
            raise _ReplicaLost(f"no answer from the replica in {self._timeout_s:.0f} s") from None
        except (PlatformError, asyncio.CancelledError):
            raise
        except Exception as exc:
            if not type(exc).__module__.startswith("ray"):
                raise
            # RayActorError (replica died), ActorUnavailableError, Serve's BackPressureError...
            raise _ReplicaLost(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from None

    def cancel(self) -> None:
        self._cancelled = True
        self._drop_call()

    def _drop_call(self) -> None:
        if self._call is not None:
            try:
                self._call.cancel()  # the replica's generator gets CancelledError and aborts
            except Exception:  # noqa: BLE001 - already finished or gone
                pass
            self._call = None

    def close(self) -> None:
        self._drop_call()
        self._gw._done(self._req["request_id"])

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
