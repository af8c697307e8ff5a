"""Per-key scopes: a key may be limited to some models (the base model or adapter names) and carry
rpm / tpm / concurrency limits of its own, on top of its tenant's.

The key's limits go through the same ``QuotaStore`` as the tenant's, under the scope id
``key:<key id>``; the key's reservation is linked to the tenant's, so settling or cancelling the
request releases both (``Reservation.linked``)."""

from __future__ import annotations

from loraplex.platform.auth.key_cache import TenantAuth
from loraplex.platform.errors import Forbidden
from loraplex.platform.quotas.store import QuotaStore, QuotaView, Reservation


class ModelNotAllowed(Forbidden):
    code = "model_not_allowed"


def model_allowed(auth: TenantAuth | None, model: str) -> bool:
    return auth is None or auth.allowed_models is None or model in auth.allowed_models


def check_model_allowed(auth: TenantAuth | None, model: str) -> None:
    if not model_allowed(auth, model):
        raise ModelNotAllowed(f"this API key may not use the model {model!r}", param="model")


def key_scope(auth: TenantAuth) -> str:
    return f"key:{auth.key_id}"


def key_quota(auth: TenantAuth) -> QuotaView | None:
    if auth.key_rpm is None and auth.key_tpm is None and auth.key_max_concurrent is None:
        return None
    return QuotaView(rpm=auth.key_rpm, tpm=auth.key_tpm, max_concurrent=auth.key_max_concurrent)


def precheck(quotas: QuotaStore, auth: TenantAuth) -> None:
    quota = key_quota(auth)
    if quota is not None:
        quotas.precheck(key_scope(auth), quota)


def charge_request(quotas: QuotaStore, auth: TenantAuth, tenant_quota: QuotaView) -> None:
    """A tenant route that generates nothing (model lookups, tokenizing, stored responses) counts
    as one request against the key's rpm and the tenant's, as generation does. The key's first:
    a key refused at its own limit does not use up its tenant's other keys' share."""
    if auth.key_rpm is not None:
        quotas.count_request(key_scope(auth), QuotaView(rpm=auth.key_rpm))
    quotas.count_request(auth.tenant_id, tenant_quota)


def precheck_concurrency(quotas: QuotaStore, auth: TenantAuth, tenant_max_concurrent: int | None) -> None:
    """Refuse (429) a tenant or key at its concurrency limit; consumes nothing. For routes already
    counted by ``charge_request``, whose rpm must not be checked a second time."""
    quotas.precheck(auth.tenant_id, QuotaView(max_concurrent=tenant_max_concurrent))
    if auth.key_max_concurrent is not None:
        quotas.precheck(key_scope(auth), QuotaView(max_concurrent=auth.key_max_concurrent))


def reserve(quotas: QuotaStore, auth: TenantAuth, tenant_hold: Reservation, tokens: int) -> None:
    """Hold ``tokens`` against the key's own limits too (or give the tenant's hold back and refuse)."""
    quota = key_quota(auth)
    if quota is None:
        return
    try:
        tenant_hold.linked = quotas.reserve(key_scope(auth), quota, tokens)
    except BaseException:
        quotas.cancel(tenant_hold)
        raise
