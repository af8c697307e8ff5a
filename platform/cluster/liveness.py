"""Is an ingress that stopped calling the control plane dead, or only slow?

The control plane holds every reservation on its ingress's lease (``control.py``). Silence alone
is not death: on a loaded machine a live ingress (or the actor itself, whose clock decides who was
silent) can go tens of seconds without a call landing, and releasing a live ingress's holds then
lets the other ingresses admit past a concurrency cap while its streams still run (seen once: 6
running at ``max_concurrent=3``, three per ingress). So a silent ingress's holds go back only when
Ray confirms its process is gone: the ingress registers its actor handle, and the control plane
pings a silent one (``__ray_ready__``, answered by any live actor) without waiting on the answer —
its calls keep running one at a time, each looks at the ping's outcome.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol


class Verdict(enum.Enum):
    DEAD = "dead"  # Ray says its process is gone: release its holds
    ALIVE = "alive"  # it answered: renew its lease
    UNKNOWN = "unknown"  # asked, no answer yet (a stall, or Ray still finding out): keep its holds
    UNWATCHED = "unwatched"  # no handle to ask (not a Ray actor): the lease's clock decides alone


class IngressLiveness(Protocol):
    def watch(self, owner: str, handle: Any) -> None: ...

    def forget(self, owner: str) -> None: ...

    def heard(self, owner: str) -> None: ...

    def verdict(self, owner: str) -> Verdict: ...

    def live_ingresses(self) -> frozenset[str] | None: ...


class RayActorLiveness:
    """Asks Ray about the ingress's actor: one ping in flight per silent ingress, never waited on.

    ``ingress_prefix``: the Ray actor names of the ingresses (an ingress names itself by its actor
    name, ``deploy.py``), so that a restarted control plane can list the ingresses Ray holds alive
    and wait for each of them — a frozen one included — to hand its holds back (``control.py``)."""

    def __init__(self, ingress_prefix: str | None = None) -> None:
        self._handles: dict[str, Any] = {}
        self._pings: dict[str, Any] = {}  # owner -> the ObjectRef of its ping in flight
        self._prefix = ingress_prefix
        self._listed: tuple[float, frozenset[str] | None] = (-1.0, None)

    def live_ingresses(self) -> frozenset[str] | None:
        """The names of the ingress actors Ray holds alive (a stopped process is alive to Ray; a
        killed one leaves the list), at most a second old; None when not known (no prefix, no Ray)."""
        if self._prefix is None:
            return None
        import time

        at, names = self._listed
        if time.monotonic() - at < 1.0:
            return names
        try:
            import ray

            actors = ray.util.list_named_actors(all_namespaces=True)
            names = frozenset(a["name"] for a in actors if a["name"].startswith(self._prefix))
        except Exception:  # noqa: BLE001 - the GCS unreachable for now: not known
            names = None
        self._listed = (time.monotonic(), names)
        return names

    def watch(self, owner: str, handle: Any) -> None:
        if handle is not None and owner not in self._handles:
            self._handles[owner] = handle

    def forget(self, owner: str) -> None:
        self._handles.pop(owner, None)
        self._pings.pop(owner, None)

    def heard(self, owner: str) -> None:
        """It called: a ping in flight is moot (its answer must not vouch for a later silence)."""
        self._pings.pop(owner, None)

    def verdict(self, owner: str) -> Verdict:
        handle = self._handles.get(owner)
        if handle is None:
            return Verdict.UNWATCHED
        import ray
        from ray.exceptions import ActorDiedError, GetTimeoutError, RayError

        ref = self._pings.get(owner)
        if ref is None:
            self._pings[owner] = handle.__ray_ready__.remote()
            return Verdict.UNKNOWN
        ready, _ = ray.wait([ref], timeout=0)
        if not ready:
            return Verdict.UNKNOWN
        del self._pings[owner]
        try:
            ray.get(ref, timeout=0)
            return Verdict.ALIVE
        except ActorDiedError:  # the process is gone (killed, crashed, its node lost)
            return Verdict.DEAD
        except (GetTimeoutError, RayError):  # unreachable for now (ActorUnavailableError, ...): ask again
            return Verdict.UNKNOWN
