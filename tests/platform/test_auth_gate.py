"""The key check before the body (platform/auth/gate.py) uses a path policy; it must say exactly
what every route's own dependencies demand, or a route would either read bodies of strangers
(policy too lax) or refuse callers it serves (policy too strict)."""

from __future__ import annotations

from fastapi.routing import iter_route_contexts

from loraplex.platform.app import KEY_POLICY, api_app
from loraplex.platform.deps import require_admin, require_tenant


def _needed_key(dependant) -> str | None:
    stack = [dependant]
    while stack:
        d = stack.pop()
        if d.call is require_admin:
            return "admin"
        if d.call is require_tenant:
            return "tenant"
        stack.extend(d.dependencies)
    return None


def test_the_gate_policy_matches_every_routes_dependencies(platform):
    app = api_app()  # the routes every server of this process serves
    checked = 0
    for route in iter_route_contexts(app.routes):
        dependant = getattr(route, "dependant", None)
        if dependant is None or route.path is None:
            continue  # static files, the admin page: no key, no body
        example = route.path.replace("{model_id:path}", "m/x")
        for name in ("tenant_id", "key_id", "adapter_id", "model_id", "response_id", "item_id"):
            example = example.replace("{" + name + "}", "abc")
        assert KEY_POLICY.kind(example) == _needed_key(dependant), (route.path, route.methods)
        checked += 1
    assert checked > 30  # the app's routes were really walked


def test_the_policy_covers_unknown_paths_under_the_apis():
    assert KEY_POLICY.kind("/v1/no-such-route") == "tenant"
    assert KEY_POLICY.kind("/admin/v1/no-such-route") == "admin"
    assert KEY_POLICY.kind("/v1/load_lora_adapter/") == "admin"
    assert KEY_POLICY.kind("/health") is None and KEY_POLICY.kind("/admin/") is None
