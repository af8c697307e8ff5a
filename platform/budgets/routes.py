"""``PUT/GET/DELETE /admin/v1/{tenants|keys|projects}/{id}/budget``: one handler set per scope."""

from __future__ import annotations

from fastapi import APIRouter, Response

from loraplex.platform.budgets import service
from loraplex.platform.budgets.schemas import BudgetIn, BudgetOut
from loraplex.platform.deps import AdminDep, SessionDep

router = APIRouter(tags=["budgets"])


def _routes(scope: str, collection: str) -> None:
    path = f"/{collection}/{{scope_id}}/budget"

    @router.put(path, response_model=BudgetOut, name=f"put_{scope}_budget")
    def put(scope_id: str, body: BudgetIn, session: SessionDep, actor: AdminDep) -> BudgetOut:
        """Set (or replace) the budget in currency; refused requests get 429 insufficient_quota."""
        return service.put_budget(session, actor, scope, scope_id, body)

    @router.get(path, response_model=BudgetOut, name=f"get_{scope}_budget")
    def get(scope_id: str, session: SessionDep, _actor: AdminDep) -> BudgetOut:
        """The budget and its current window: spent, reserved (running requests), remaining."""
        return service.get_budget(session, scope, scope_id)

    @router.delete(path, status_code=204, name=f"delete_{scope}_budget")
    def remove(scope_id: str, session: SessionDep, actor: AdminDep) -> Response:
        service.delete_budget(session, actor, scope, scope_id)
        return Response(status_code=204)


_routes("tenant", "tenants")
_routes("key", "keys")
# Answers 404 "project not found" until the projects package is merged (``owners._project_tenant``).
_routes("project", "projects")
