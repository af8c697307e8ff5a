from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from loraplex.platform.deps import AdminDep, ContextDep

router = APIRouter(tags=["engine"])


@router.get("/engine")
def engine_state(ctx: ContextDep, _actor: AdminDep) -> dict[str, Any]:
    """Live engine state: per-tenant running/waiting, batch size, KV use, resident adapters."""
    stats = ctx.gateway.stats()
    stats["registered_adapters"] = ctx.gateway.registered_adapters()
    return stats
