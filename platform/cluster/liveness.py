"""Which ingresses are alive: one answer, Ray's list of the ingress actors it holds.

The control plane needs it twice (``control.py``):

- an ingress that stopped calling for longer than its lease: is it dead, or only slow? Silence
  alone is not death: on a loaded machine a live ingress (or the actor itself, whose clock decides
  who was silent) can go tens of seconds without a call landing, and releasing a live ingress's
  holds then lets the other ingresses admit past a concurrency cap while its streams still run
  (seen once: 6 running at ``max_concurrent=3``, three per ingress);
- a restarted control plane: which ingresses must hand their live holds back before it admits a
  new limited one.

Each ingress names itself by its Serve replica actor (``deploy.py``), so both questions read the
same list: ``ray.util.list_named_actors``. A stopped (frozen) process is alive to Ray and stays
listed: it may hold real slots. A killed one, or one on a lost node, leaves the list; so does a
frozen one once Serve replaces it for failing its health checks.

A restarted control plane waits only for the live ingresses that ever held a reservation: each
one's name is recorded in Ray's GCS key-value store when it first holds one (it outlives the
actor). Serve's replacement for an ingress killed with the actor is listed within seconds but
holds nothing until its start-up is done (tens of seconds on a busy box): waiting for it held
every limited tenant back that long (a hostile run: 37-51 s).
"""

from __future__ import annotations

import enum
import json
import time
from typing import Protocol

_KV_NAMESPACE = "loraplex"


class Verdict(enum.Enum):
    DEAD = "dead"  # a named ingress Ray no longer holds: release its holds
    ALIVE = "alive"  # Ray holds its actor: only slow, renew its lease
    UNKNOWN = "unknown"  # the list cannot be read now (the GCS unreachable): keep its holds
    UNNAMED = "unnamed"  # not a name Ray lists (no Serve actor): the lease's clock decides alone


class IngressDirectory(Protocol):
    def live(self) -> frozenset[str] | None:
        """The names of the live ingresses; None when not known."""
        ...

    def verdict(self, owner: str) -> Verdict: ...

    def holders(self) -> frozenset[str] | None:
        """The ingresses recorded as having held a reservation (with any instance); None: unknown."""
        ...

    def held_by(self, owner: str) -> None:
        """Record that ``owner`` holds a reservation (once per owner and instance)."""
        ...


class RayIngressDirectory:
    """The ingress actors Ray holds alive, by their name prefix (``SERVE_REPLICA::<app>#ingress#``);
    the list is read at most once a second (one GCS call, on the actor's own thread)."""

    def __init__(self, prefix: str | None = None, max_age_s: float = 1.0) -> None:
        self._prefix = prefix
        self._max_age_s = max_age_s
        self._listed: tuple[float, frozenset[str] | None] = (float("-inf"), None)
        self._recorded: set[str] | None = None  # the holders as read from / written to the GCS

    def holders(self) -> frozenset[str] | None:
        if self._prefix is None:
            return None
        try:
            from ray.experimental import internal_kv

            raw = internal_kv._internal_kv_get(self._key(), namespace=_KV_NAMESPACE)
        except Exception:  # noqa: BLE001 - the GCS unreachable: not known
            return None
        self._recorded = set(json.loads(raw)) if raw else set()
        return frozenset(self._recorded)

    def held_by(self, owner: str) -> None:
        if self._prefix is None or not owner.startswith(self._prefix):
            return
        if self._recorded is None:
            self.holders()
        if self._recorded is None or owner in self._recorded:
            return
        live = self.live()
        # the record stays small: names Ray no longer lists are dropped as a new one is added
        self._recorded = {n for n in self._recorded if live is None or n in live} | {owner}
        try:
            from ray.experimental import internal_kv

            internal_kv._internal_kv_put(
                self._key(), json.dumps(sorted(self._recorded)), overwrite=True, namespace=_KV_NAMESPACE
            )
        except Exception:  # noqa: BLE001 - not recorded: a restart then waits for every live ingress
            self._recorded = None

    def _key(self) -> str:
        return f"holders:{self._prefix}"

    def live(self) -> frozenset[str] | None:
        if self._prefix is None:
            return None
        at, names = self._listed
        if time.monotonic() - at < self._max_age_s:
            return names
        try:
            import ray

            actors = ray.util.list_named_actors(all_namespaces=True)
            names = frozenset(a["name"] for a in actors if a["name"].startswith(self._prefix))
        except Exception:  # noqa: BLE001 - the GCS unreachable for now: not known
            names = None
        self._listed = (time.monotonic(), names)
        return names

    def verdict(self, owner: str) -> Verdict:
        if self._prefix is None or not owner.startswith(self._prefix):
            return Verdict.UNNAMED
        live = self.live()
        if live is None:
            return Verdict.UNKNOWN
        return Verdict.ALIVE if owner in live else Verdict.DEAD
