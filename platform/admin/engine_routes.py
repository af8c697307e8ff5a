from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from loraplex.platform.deps import AdminDep, ContextDep
from loraplex.platform.errors import NotFound

router = APIRouter(tags=["engine"])


@router.get("/engine")
def engine_state(ctx: ContextDep, _actor: AdminDep) -> dict[str, Any]:
    """Live engine state: per-tenant running/waiting, batch size, KV use, resident adapters."""
    stats = ctx.engine.stats()
    stats["registered_adapters"] = ctx.engine.registered_adapters()
    return stats


@router.post("/debug/engine-fault", include_in_schema=False)
def inject_engine_fault(ctx: ContextDep, _actor: AdminDep) -> dict[str, Any]:
    """Tests only (``server.fault_injection``): the engine loop dies between two steps as if a step
    had raised; the server then answers 503 on /ready and exits non-zero (``health.EngineWatchdog``)."""
    inject = getattr(ctx.engine, "inject_fault", None)
    if not ctx.settings.server.fault_injection or inject is None:
        raise NotFound("Not Found")
    inject()
    return {"injected": True}
