"""The admin page signed in with SSO, in Chromium, through a real OpenID Connect provider's own login
form (oidc-provider-mock): the user and role shown, a change made from the page carries the CSRF
token and its Origin (audited as sso:<email>), a viewer's change refused with the server's message,
sign-out revokes the session."""

from __future__ import annotations

import pytest
from harness.live import LiveServer
from harness.oidc import OIDCProvider
from platform_helpers import ADMIN_KEY, make_settings
from playwright.sync_api import expect
from sqlalchemy import select
from sso_helpers import CLIENT_ID, CLIENT_SECRET, USERS

from loraplex.platform.admin.sso.models import AdminSession
from loraplex.platform.app import build_context, create_app
from loraplex.platform.audit.models import AuditEntry
from loraplex.platform.db import migrate
from loraplex.platform.db.session import unit_of_work

pytestmark = pytest.mark.slow  # a browser


@pytest.fixture
def sso_site(tmp_path):
    db_url = f"sqlite:///{tmp_path / 'sso.db'}"
    migrate.upgrade(db_url)
    with OIDCProvider(USERS) as provider:
        settings = make_settings(
            tmp_path,
            db_url,
            admin_key=ADMIN_KEY,
            sso={
                "enabled": True,
                "issuer": provider.issuer,
                "client_id": CLIENT_ID,
                "client_secret": CLIENT_SECRET,
                "base_url": "http://placeholder.invalid",
                "role_map": {"ops": ["admin"], "auditors": ["viewer"]},
            },
        )
        ctx, _ = build_context(settings, upgrade_db=False)
        with LiveServer(create_app(ctx), ctx) as srv:
            ctx.settings.sso.base_url = srv.url  # known once it listens; read at the first sign-in
            yield srv


@pytest.fixture
def sso_page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900}, locale="en-US")
    context.set_default_timeout(15_000)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    context.close()
    assert not errors, errors


def _sign_in_with_sso(page, srv, sub: str) -> None:
    page.goto(srv.url + "/admin/")
    page.get_by_role("link", name="Sign in with SSO").click()
    page.get_by_role("button", name=sub, exact=True).click()  # the provider's own form: a known user
    expect(page.get_by_role("heading", name="Tenants", exact=True)).to_be_visible()


def _actors(srv, action: str) -> list[str]:
    with unit_of_work(srv.ctx.sessions) as s:
        return [e.actor for e in s.scalars(select(AuditEntry).where(AuditEntry.action == action))]


def test_admin_signs_in_with_sso_and_changes_are_audited(sso_site, sso_page):
    page = sso_page
    _sign_in_with_sso(page, sso_site, "alice")
    expect(page.locator("#whoami")).to_have_text("alice@example.com · admin")
    page.get_by_label("Name").fill("from-the-page")
    page.get_by_role("button", name="Create tenant").click()
    expect(page.get_by_role("cell", name="from-the-page", exact=True)).to_be_visible()
    assert _actors(sso_site, "tenant.create") == ["sso:alice@example.com"]

    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("link", name="Sign in with SSO")).to_be_visible()
    with unit_of_work(sso_site.ctx.sessions) as s:
        assert all(row.revoked_at is not None for row in s.scalars(select(AdminSession)))
    page.reload()  # the cookie is gone and the session revoked: still signed out
    expect(page.get_by_role("link", name="Sign in with SSO")).to_be_visible()


def test_viewer_sees_the_refusal(sso_site, sso_page):
    page = sso_page
    _sign_in_with_sso(page, sso_site, "vera")
    expect(page.locator("#whoami")).to_have_text("vera@example.com · viewer")
    page.get_by_label("Name").fill("not-allowed")
    page.get_by_role("button", name="Create tenant").click()
    expect(page.locator("#error-text")).to_contain_text("read-only")
    assert _actors(sso_site, "tenant.create") == []
