"""The pieces of SSO that need no server: the route template the role allowlist is keyed by, claim
values to roles, and the settings that refuse an unusable [sso] table."""

from __future__ import annotations

import pytest

from loraplex.platform.admin.sso.roles import TENANT_ADMIN_ROUTES, roles_for_claims, route_template
from loraplex.platform.settings import SSOSettings


@pytest.mark.parametrize(
    ("path", "fmt", "expected"),
    [
        ("/admin/v1/tenants/ten_1/keys", "/tenants/{tenant_id}/keys", "/admin/v1/tenants/{tenant_id}/keys"),
        ("/admin/v1/keys/keys", "/keys/{key_id}", "/admin/v1/keys/{key_id}"),  # an id equal to a literal
        ("/admin/v1/adapters", "/adapters", "/admin/v1/adapters"),
        ("/admin/v1/adapters/", "/adapters", "/admin/v1/adapters"),
        ("/admin/v1/usage/export", "/usage/export", "/admin/v1/usage/export"),
    ],
)
def test_route_template(path, fmt, expected):
    assert route_template(path, fmt) == expected


def test_every_tenant_admin_route_exists_in_the_app():
    """A renamed route would silently drop out of the allowlist (fail closed, but a broken role)."""
    from fastapi import FastAPI

    from loraplex.platform.admin.router import router

    app = FastAPI()
    app.include_router(router)
    served = {(m.upper(), path) for path, ops in app.openapi()["paths"].items() for m in ops}
    assert set(TENANT_ADMIN_ROUTES) <= served, set(TENANT_ADMIN_ROUTES) - served


def test_roles_for_claims():
    role_map = {"ops": ["admin"], "aud": ["viewer"], "x@example.com": ["tenant_admin:t1"]}
    assert roles_for_claims({"groups": ["ops", "aud", "other"]}, "groups", role_map) == ["admin", "viewer"]
    assert roles_for_claims({"email": "x@example.com"}, "email", role_map) == ["tenant_admin:t1"]
    assert roles_for_claims({"groups": "ops"}, "groups", role_map) == ["admin"]
    assert roles_for_claims({}, "groups", role_map) == []
    assert roles_for_claims({"groups": [{"name": "ops"}]}, "groups", role_map) == []  # not strings: no role


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"enabled": True, "client_id": "c", "base_url": "https://a", "role_map": {"g": ["admin"]}}, "sso.issuer"),
        ({"enabled": True, "issuer": "https://i", "client_id": "c", "base_url": "https://a"}, "role_map"),
        ({"role_map": {"g": ["root"]}}, "unknown role"),
        ({"role_map": {"g": ["tenant_admin:"]}}, "unknown role"),
    ],
)
def test_unusable_sso_settings_refused(values, message):
    with pytest.raises(ValueError, match=message):
        SSOSettings(**values)
