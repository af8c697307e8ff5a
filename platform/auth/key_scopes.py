"""Per-key scopes: a key may be limited to some models (the base model or adapter names) and carry
rpm / tpm / concurrency limits of its own, on top of its tenant's; a key of a project carries the
project's too (``platform/projects/scope.py``), on top of both.

The key's limits go through the same ``QuotaStore`` as the tenant's, under the scope id
``key:<key id>`` (a project's: ``project:<project id>``); these holds are linked to the tenant's,
so settling or cancelling the request releases them all (``Reservation.linked``)."""

from __future__ import annotations

from loraplex.platform.auth.key_cache import TenantAuth
from loraplex.platform.errors import Forbidden
from loraplex.platform.projects.scope import link
from loraplex.platform.quotas.store import QuotaStore, QuotaView, Reservation


class ModelNotAllowed(Forbidden):
    code = "model_not_allowed"


def model_allowed(auth: TenantAuth | None, model: str) -> bool:
    if auth is None:
        return True
    if auth.project is not None and not auth.project.allows(model):
        return False
    return auth.allowed_models is None or model in auth.allowed_models


def check_model_allowed(auth: TenantAuth | None, model: str) -> None:
    if not model_allowed(auth, model):
        raise ModelNotAllowed(f"this API key may not use the model {model!r}", param="model")


def key_scope(auth: TenantAuth) -> str:
    return f"key:{auth.key_id}"


def key_quota(auth: TenantAuth) -> QuotaView | None:
    if auth.key_rpm is None and auth.key_tpm is None and auth.key_max_concurrent is None:
        return None
    return QuotaView(rpm=auth.key_rpm, tpm=auth.key_tpm, max_concurrent=auth.key_max_concurrent)


def own_scopes(auth: TenantAuth) -> list[tuple[str, QuotaView]]:
    """The limits a request answers to besides its tenant's, key first: a key refused at its own
    limit does not use up its project's (or tenant's) share."""
    scopes = []
    key = key_quota(auth)
    if key is not None:
        scopes.append((key_scope(auth), key))
    project = auth.project.quota if auth.project is not None else None
    if project is not None and auth.project is not None:
        scopes.append((auth.project.scope, project))
    return scopes


def precheck(quotas: QuotaStore, auth: TenantAuth) -> None:
    for scope, quota in own_scopes(auth):
        quotas.precheck(scope, quota)


def charge_request(quotas: QuotaStore, auth: TenantAuth, tenant_quota: QuotaView) -> None:
    """A tenant route that generates nothing (model lookups, tokenizing, stored responses) counts
    as one request against the key's rpm, its project's and the tenant's, as generation does."""
    for scope, quota in own_scopes(auth):
        if quota.rpm is not None:
            quotas.count_request(scope, QuotaView(rpm=quota.rpm))
    quotas.count_request(auth.tenant_id, tenant_quota)


def precheck_concurrency(quotas: QuotaStore, auth: TenantAuth, tenant_max_concurrent: int | None) -> None:
    """Refuse (429) a tenant, key or project at its concurrency limit; consumes nothing. For routes
    already counted by ``charge_request``, whose rpm must not be checked a second time."""
    quotas.precheck(auth.tenant_id, QuotaView(max_concurrent=tenant_max_concurrent))
    for scope, quota in own_scopes(auth):
        if quota.max_concurrent is not None:
            quotas.precheck(scope, QuotaView(max_concurrent=quota.max_concurrent))


def reserve(quotas: QuotaStore, auth: TenantAuth, tenant_hold: Reservation, tokens: int) -> None:
    """Hold ``tokens`` against the key's and project's own limits too (or give every hold back and
    refuse)."""
    try:
        for scope, quota in own_scopes(auth):
            link(tenant_hold, quotas.reserve(scope, quota, tokens))
    except BaseException:
        quotas.cancel(tenant_hold)
        raise
