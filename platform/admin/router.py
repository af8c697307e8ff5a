"""The admin REST API: every domain's admin routes under /admin/v1."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from loraplex.platform.adapters.routes import router as adapters
from loraplex.platform.admin.engine_routes import router as engine
from loraplex.platform.alerts.routes import router as alerts
from loraplex.platform.audit.routes import router as audit
from loraplex.platform.budgets.routes import router as budgets
from loraplex.platform.keys.routes import router as keys
from loraplex.platform.pricing.routes import router as pricing
from loraplex.platform.projects.routes import router as projects
from loraplex.platform.quotas.consumption import router as quota_consumption
from loraplex.platform.quotas.routes import router as quotas
from loraplex.platform.tenants.routes import router as tenants
from loraplex.platform.usage.routes import router as usage
from loraplex.platform.usage.series import router as usage_series

ADMIN_PREFIX = "/admin/v1"

_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {
        "description": desc,
        "content": {
            "application/json": {
                "example": {"error": {"message": desc, "type": "invalid_request_error", "param": None, "code": None}}
            }
        },
    }
    for code, desc in [
        (400, "Bad request"),
        (401, "Missing or invalid admin key"),
        (403, "Not an admin key"),
        (404, "Not found"),
        (409, "Conflict"),
        (422, "Invalid field"),
    ]
}

router = APIRouter(prefix=ADMIN_PREFIX, responses=_ERROR_RESPONSES)
for sub in (
    tenants,
    projects,
    keys,
    quotas,
    quota_consumption,
    adapters,
    usage,
    usage_series,
    pricing,
    audit,
    engine,
    alerts,
):
    router.include_router(sub)
router.include_router(budgets)  # budgets in currency (tenants, keys, projects)
