"""What a key's project adds to its request, as the request path sees it (cached with the key in
``TenantAuth``): limits on top of the tenant's and the key's, a model allowlist inside theirs, and
the project's place in the tenant's fair share.

The limits go through the same ``QuotaStore`` as the tenant's and the key's, under the scope id
``project:<project id>`` (so a scale-out's shared quota actor counts them across replicas); the
project's hold is linked to the tenant's and released with it (``Reservation.linked``)."""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.engine import FairGroup
from loraplex.platform.quotas.store import QuotaView, Reservation


@dataclass(frozen=True)
class ProjectAuth:
    project_id: str
    name: str
    archived: bool
    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None
    allowed_models: tuple[str, ...] | None = None
    priority: int = 0
    weight: float = 1.0

    @property
    def scope(self) -> str:
        return f"project:{self.project_id}"

    @property
    def quota(self) -> QuotaView | None:
        if self.rpm is None and self.tpm is None and self.max_concurrent is None:
            return None
        return QuotaView(rpm=self.rpm, tpm=self.tpm, max_concurrent=self.max_concurrent)

    def allows(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models


def link(first: Reservation, hold: Reservation) -> None:
    """Chain ``hold`` after the last hold linked to ``first`` (tenant → key → project): settling or
    cancelling the tenant's releases every one of them."""
    while first.linked is not None:
        first = first.linked
    first.linked = hold


def fair_group(project: ProjectAuth | None) -> FairGroup | None:
    """The engine's view of a project: an opaque key with a priority and weight inside its tenant."""
    if project is None:
        return None
    return FairGroup(project.project_id, project.priority, project.weight)
