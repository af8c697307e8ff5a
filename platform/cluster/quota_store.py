"""``QuotaStore`` backed by the control-plane actor: the same four calls as the in-process store,
exact across every ingress replica (the actor serialises them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loraplex.platform.cluster.control import raise_refusal
from loraplex.platform.errors import ServiceUnavailable
from loraplex.platform.quotas.store import QuotaView, Reservation

CALL_TIMEOUT_S = 10.0


@dataclass
class ActorReservation(Reservation):
    key: str = ""  # the actor keeps the real reservation; this names it


class ActorQuotaStore:
    def __init__(self, actor: Any) -> None:
        self._actor = actor

    def _get(self, ref: Any) -> Any:
        import ray

        try:
            return ray.get(ref, timeout=CALL_TIMEOUT_S)
        except Exception as exc:  # actor gone or stuck: refuse rather than admit unmetered
            raise ServiceUnavailable(
                f"the quota coordinator is unavailable: {type(exc).__name__}", headers={"retry-after": "5"}
            ) from None

    def precheck(self, tenant_id: str, quota: QuotaView) -> None:
        refusal = self._get(self._actor.precheck.remote(tenant_id, quota))
        if refusal is not None:
            raise_refusal(refusal)

    def reserve(self, tenant_id: str, quota: QuotaView, tokens: int) -> Reservation:
        got = self._get(self._actor.reserve.remote(tenant_id, quota, tokens))
        if "refused" in got:
            raise_refusal(got["refused"])
        return ActorReservation(tenant_id, got["tokens"], got["headers"], got["admitted_at"], key=got["key"])

    # settle/cancel run on the event loop at a request's end: fire and forget (an actor executes
    # one caller's calls in submission order, so a later reserve sees this release).
    def settle(self, reservation: Reservation, used_tokens: int) -> None:
        if not reservation.done:
            reservation.done = True
            self._actor.settle.remote(_key(reservation), used_tokens)
        if reservation.linked is not None:  # an API key's own hold (platform/auth/key_scopes.py)
            self.settle(reservation.linked, used_tokens)

    def cancel(self, reservation: Reservation) -> None:
        if not reservation.done:
            reservation.done = True
            self._actor.cancel.remote(_key(reservation))
        if reservation.linked is not None:
            self.cancel(reservation.linked)

    def running(self, tenant_id: str) -> int:
        return int(self._get(self._actor.running.remote(tenant_id)))

    def usage_now(self, tenant_id: str) -> dict[str, int]:
        return dict(self._get(self._actor.usage_now.remote(tenant_id)))


def _key(reservation: Reservation) -> str:
    return reservation.key if isinstance(reservation, ActorReservation) else ""
