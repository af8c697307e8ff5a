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
