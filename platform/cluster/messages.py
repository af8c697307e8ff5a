"""Every message between the ingresses, the control-plane actor and the engine replicas, typed.

Ray pickles them; both ends are the same code (one deployment), so a field added here reaches
every sender and reader at once, and mypy checks both. Three conversations:

- ingress ↔ control plane (``control.py``): quota holds (``ReserveItem`` → ``Hold`` /
  ``Refusal`` / ``Retry``; ``HeldReservation`` handed back after a restart), tenant and adapter
  changes (``TenantSettings``, ``StoredAdapter`` / ``AdapterReference``), and the ingress's tick
  (``Snapshot``: replicas, draining, admin aborts, the control plane's own status);
- replica ↔ control plane: the desired engine state (``EngineState``, pulled by version) and the
  heartbeat (``ReplicaReport`` → ``HeartbeatAnswer``: the other replicas' fair-share service);
- ingress ↔ replica (``replica.py``, ``remote_stream.py``): ``GenerateRequest`` in, a stream of
  ``Accepted``, ``Output`` and at most one ``StreamError`` out. A platform error crosses as its
  HTTP meaning (status, type, code, message, param, headers) and is raised again as the platform
  error class of that status: nothing is looked up by a class name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loraplex.platform.adapters.sources.uri import AdapterReference
from loraplex.platform.engine_client.protocol import EngineStats
from loraplex.platform.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    PlatformError,
    RateLimited,
    ServiceUnavailable,
    Unauthorized,
    Unprocessable,
)
from loraplex.platform.quotas.store import QuotaView

if TYPE_CHECKING:
    from loraplex.engine import FairGroup, RequestOutput, SamplingParams

# -- quota holds (ingress -> control plane) ---------------------------------------------------


@dataclass(frozen=True)
class ReserveItem:
    """One admission's hold. ``key`` is chosen by the ingress: sent again after a lost answer, it
    is answered with the same hold, never a second one."""

    key: str
    tenant_id: str
    quota: QuotaView
    tokens: int


@dataclass(frozen=True)
class Hold:
    """Admitted: the control plane holds ``tokens`` for the tenant under ``key``."""

    key: str
    tokens: int
    headers: dict[str, str]
    admitted_at: float
    epoch: str  # the control-plane instance that holds it


@dataclass(frozen=True)
class Refusal:
    """A limit refused the hold (the 429 the client gets)."""

    message: str
    code: str | None
    headers: dict[str, str]

    @classmethod
    def of(cls, exc: RateLimited) -> Refusal:
        return cls(exc.message, exc.code, dict(exc.headers))

    def error(self) -> RateLimited:
        return RateLimited(self.message, code=self.code, headers=dict(self.headers))


@dataclass(frozen=True)
class Retry:
    """A restarted control plane still collecting the ingresses' live holds: send again."""

    epoch: str


ReserveAnswer = Hold | Refusal | Retry


@dataclass(frozen=True)
class HeldReservation:
    """A live hold an ingress hands back to a new control-plane instance (``adopt``)."""

    key: str
    tenant_id: str
    tokens: int
    budget_period: str | None  # the budget period it holds tokens against (None: no budget)


# -- desired engine state (ingress -> control plane -> replicas) ------------------------------


@dataclass(frozen=True)
class TenantSettings:
    priority: int
    weight: float
    max_running_seqs: int | None  # None: the engine-wide default cap


@dataclass(frozen=True)
class StoredAdapter:
    """An uploaded adapter: a folder in the adapter store (``data_dir/adapters``), which a
    multi-node deployment mounts on every node."""

    path: str


# What a replica loads for an adapter key: a store folder, or a reference it fetches itself.
AdapterSource = StoredAdapter | AdapterReference


@dataclass(frozen=True)
class EngineState:
    """The whole desired engine state (it is small), at ``version``."""

    version: int
    tenants: dict[str, TenantSettings]
    adapters: dict[str, AdapterSource]


# -- replica registry (replica -> control plane) ----------------------------------------------


@dataclass(frozen=True)
class ReplicaReport:
    """A replica's heartbeat: who it is, the state version it applied, its engine's live stats
    and its adapter fetcher's counters. ``seen`` is set by the control plane on arrival."""

    replica: str
    pid: int
    applied_version: int
    engine: EngineStats
    adapter_sources: dict[str, int] = field(default_factory=dict)
    seen: float = 0.0

    @property
    def running(self) -> bool:
        return bool(self.engine.get("running", True))

    @property
    def max_model_len(self) -> int | None:
        value = self.engine.get("max_model_len")
        return value if isinstance(value, int) else None

    def as_json(self) -> dict[str, object]:
        """One entry of ``/admin/v1/engine``'s ``replicas`` (the engine's stats, flat)."""
        return {
            **self.engine,
            "replica": self.replica,
            "pid": self.pid,
            "applied_version": self.applied_version,
            "adapter_sources": self.adapter_sources,
            "seen": self.seen,
        }


@dataclass(frozen=True)
class HeartbeatAnswer:
    version: int  # the desired state's: a replica behind it pulls
    others: dict[str, float]  # fair-share service every OTHER replica gave each tenant (cumulative)


# -- the ingress's tick (ingress -> control plane) --------------------------------------------


@dataclass(frozen=True)
class AbortMatch:
    """Which in-flight requests an admin abort ends (None: any)."""

    tenant_id: str | None = None
    key_id: str | None = None
    adapter_id: str | None = None


@dataclass(frozen=True)
class Abort:
    seq: int
    reason: str
    match: AbortMatch


@dataclass(frozen=True)
class DrainProgress:
    """What a drain waits for (driver <- control plane): the live reservations (by the ingress
    that holds them), and the requests in flight the ingresses reported at their last tick."""

    reservations: int
    in_flight: int
    ingresses: int  # how many ingresses reported recently
    by_owner: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ControlStatus:
    """The control-plane instance as ``/admin/v1/engine`` → ``control`` shows it."""

    pid: int
    epoch: str
    live_reservations: int
    ingresses: list[str]  # ingresses holding a lease
    live_ingresses: list[str] | None  # the ingress actors Ray holds alive (None: unreadable)
    released_by_lease: int
    started_at: float  # wall clock, seconds
    admitting_at: float | None  # when limited holds were admitted again after a restart
    restarted: bool

    def as_json(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Snapshot:
    """What one ingress tick gets: the instance (``epoch``; ``readopt``: this ingress's lease had
    lapsed, hand the live holds back), the replicas, draining, and admin aborts after the ones the
    ingress had seen."""

    epoch: str
    readopt: bool
    control: ControlStatus
    version: int
    replicas: list[ReplicaReport]
    draining: bool
    aborts: list[Abort]
    abort_seq: int


# -- a request on an engine replica (ingress <-> replica) -------------------------------------


@dataclass(frozen=True)
class GenerateRequest:
    prompt_ids: list[int]
    params: SamplingParams
    request_id: str
    tenant_id: str
    cache_salt: str | None
    version: int  # the desired state it was admitted under: a replica behind it pulls first
    adapter: str | None  # with affinity routing it also travels as Serve's multiplexed model id
    resume_token_ids: list[int] | None = None  # a checkpoint: output another replica already produced
    fair_group: FairGroup | None = None  # the key's project inside its tenant's fair share


@dataclass(frozen=True)
class Accepted:
    """The replica's engine took the request (sent once, first)."""

    replica: str


@dataclass(frozen=True)
class Output:
    """One DELTA output of the engine (all choices, logprobs)."""

    out: RequestOutput


_CLASS_OF_STATUS: dict[int, type[PlatformError]] = {
    cls.status_code: cls
    for cls in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        Conflict,
        PayloadTooLarge,
        Unprocessable,
        RateLimited,
        ServiceUnavailable,
    )
}


@dataclass(frozen=True)
class StreamError:
    """A platform error on the replica, as its HTTP meaning."""

    status: int
    type: str
    message: str
    param: str | None
    code: str | None
    headers: dict[str, str]

    ENGINE_UNAVAILABLE = "engine_unavailable"  # the replica's engine loop is dead: resume elsewhere

    @classmethod
    def of(cls, exc: PlatformError) -> StreamError:
        return cls(exc.status_code, exc.type, exc.message, exc.param, exc.code, dict(exc.headers))

    def error(self) -> PlatformError:
        """The same error on this side: the platform error class of its status, with its status,
        type and code as sent (a subclass's own code or type included)."""
        cls = _CLASS_OF_STATUS.get(self.status, PlatformError)
        exc = cls(self.message, param=self.param, code=self.code, headers=dict(self.headers))
        exc.status_code, exc.type = self.status, self.type
        return exc


StreamChunk = Accepted | Output | StreamError
