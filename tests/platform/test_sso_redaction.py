"""A tenant admin (SSO) listing the adapters its tenant may use never sees another tenant's id
(issue 37 gap): an adapter another tenant owns and granted to it shows no owner, and its grants
list only the tenant admin's own tenant; the operator still sees everything."""

from __future__ import annotations

import httpx
import pytest
from harness.adapters import zip_bytes
from harness.live import LiveServer
from harness.oidc import OIDCProvider
from platform_helpers import admin_headers, make_settings
from sso_helpers import CLIENT_ID, CLIENT_SECRET, USERS, sign_in

from loraplex.platform.app import build_context, create_app

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def provider():
    with OIDCProvider(USERS) as p:
        yield p


def _server(tmp_path, db_url, issuer, engine) -> LiveServer:
    """sso_helpers.sso_server with the session's engine (uploads validate against the base model)."""
    sso = {
        "enabled": True,
        "issuer": issuer,
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "base_url": "http://placeholder.invalid",
        "role_claim": "groups",
        "role_map": {"ops": ["admin"], "auditors": ["viewer"]},
    }
    ctx, _ = build_context(make_settings(tmp_path / "srv", db_url, sso=sso), engine, upgrade_db=False)
    srv = LiveServer(create_app(ctx, owns_engine=False), ctx)
    ctx.settings.sso.base_url = srv.url
    return srv


def test_tenant_admin_sees_no_other_tenant_ids(tmp_path, db_url, provider, good_files, demo_engine):
    srv = _server(tmp_path, db_url, provider.issuer, demo_engine)
    try:
        admin = httpx.Client(base_url=f"{srv.url}/admin/v1", headers=admin_headers(), timeout=60)
        acme = admin.post("/tenants", json={"name": "acme"}).json()["id"]
        other = admin.post("/tenants", json={"name": "other"}).json()["id"]
        third = admin.post("/tenants", json={"name": "third"}).json()["id"]
        files = {"file": ("a.zip", zip_bytes(good_files))}
        theirs = admin.post("/adapters", data={"name": "theirs", "tenant_id": other}, files=files).json()
        mine = admin.post("/adapters", data={"name": "mine", "tenant_id": acme}, files=files).json()
        admin.post("/adapters", data={"name": "everyone", "visibility": "shared"}, files=files).raise_for_status()
        for adapter, tenant in ((theirs, acme), (theirs, third), (mine, other)):
            admin.post(f"/adapters/{adapter['id']}/grants", json={"tenant_id": tenant}).raise_for_status()

        srv.ctx.settings.sso.role_map["acme-admins"] = [f"tenant_admin:{acme}"]
        tom = sign_in(srv, "tom")
        listed = tom.get(f"{srv.url}/admin/v1/adapters", params={"tenant_id": acme})
        assert listed.status_code == 200, listed.text
        assert other not in listed.text and third not in listed.text, listed.text
        by_name = {a["name"]: a for a in listed.json()["data"]}
        assert set(by_name) == {"theirs", "mine", "everyone"}
        assert by_name["theirs"]["owner_tenant_id"] is None and by_name["theirs"]["granted_tenant_ids"] == [acme]
        assert by_name["mine"]["owner_tenant_id"] == acme and by_name["mine"]["granted_tenant_ids"] == []
        one = tom.get(f"{srv.url}/admin/v1/adapters/{mine['id']}")
        assert one.status_code == 200 and other not in one.text, one.text

        # the operator (admin key) still sees every id
        full = {a["name"]: a for a in admin.get("/adapters", params={"tenant_id": acme}).json()["data"]}
        assert full["theirs"]["owner_tenant_id"] == other
        assert sorted(full["theirs"]["granted_tenant_ids"]) == sorted([acme, third])
    finally:
        srv.stop()


def test_a_viewer_never_sees_a_webhook_urls_path(tmp_path, db_url, provider, demo_engine):
    """Slack/Discord/Teams incoming-webhook URLs carry their credential in the path: the operator
    admin sees it whole, a viewer (and the audit log every viewer reads) the origin only."""
    srv = _server(tmp_path, db_url, provider.issuer, demo_engine)
    try:
        srv.ctx.settings.alerts.allowed_hosts = ["127.0.0.1"]
        url = "http://127.0.0.1:9/services/T0ABC/B0DEF/SeCrEtPaTh?token=also-secret"
        admin = httpx.Client(base_url=f"{srv.url}/admin/v1", headers=admin_headers(), timeout=60)
        r = admin.post("/webhooks", json={"url": url, "secret": "x" * 32})
        assert r.status_code == 201, r.text
        assert [h["url"] for h in admin.get("/webhooks").json()["data"]] == [url]
        vera = sign_in(srv, "vera")
        seen = vera.get(f"{srv.url}/admin/v1/webhooks")
        assert seen.status_code == 200 and [h["url"] for h in seen.json()["data"]] == ["http://127.0.0.1:9/…"]
        audit = vera.get(f"{srv.url}/admin/v1/audit", params={"action": "webhook.create"})
        assert audit.status_code == 200 and audit.json()["data"], audit.text
        assert "SeCrEtPaTh" not in audit.text and "also-secret" not in audit.text
    finally:
        srv.stop()
