"""Projects (platform/projects): the admin routes, keys of a project, an archived project's keys,
the model allowlist and the limits on top of the tenant's and the key's, the audit log, and a
tenant admin (SSO role) limited to its own tenant's projects. SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from platform_helpers import admin_headers, assert_error
from projects_helpers import H, complete, key, project, tenant_with_adapters

from loraplex.platform.admin.sso.roles import authorize
from loraplex.platform.auth.admin import Actor
from loraplex.platform.errors import Forbidden


def _code(resp, status, code=None):
    err = assert_error(resp, status)
    if code is not None:
        assert err["code"] == code, err
    return err


def test_create_list_get_patch_archive(client, good_files):
    tid = tenant_with_adapters(client, good_files, adapters=())
    p = project(client, tid, name="search", rpm=10, tpm=1000, max_concurrent=2, models=["b", "a", "a"], weight=3)
    assert (p["object"], p["tenant_id"], p["name"], p["status"]) == ("project", tid, "search", "active")
    assert (p["rpm"], p["tpm"], p["max_concurrent"], p["models"], p["priority"], p["weight"]) == (
        10,
        1000,
        2,
        ["a", "b"],
        0,
        3.0,
    )
    # the name is unique per tenant, not across tenants
    _code(client.post(f"/admin/v1/tenants/{tid}/projects", json={"name": "search"}, headers=H), 409)
    other = client.post("/admin/v1/tenants", json={"name": "other"}, headers=H).json()["id"]
    assert project(client, other, name="search")["tenant_id"] == other
    second = project(client, tid, name="ads")
    listed = client.get(f"/admin/v1/tenants/{tid}/projects", headers=H).json()
    assert [x["name"] for x in listed["data"]] == ["search", "ads"]
    assert client.get(f"/admin/v1/projects/{p['id']}", headers=H).json()["name"] == "search"
    # PATCH changes what is sent; null clears a limit or the allowlist; name/priority/weight cannot be null
    r = client.patch(f"/admin/v1/projects/{p['id']}", json={"rpm": None, "models": None, "priority": 2}, headers=H)
    assert r.status_code == 200, r.text
    assert (r.json()["rpm"], r.json()["models"], r.json()["priority"], r.json()["tpm"]) == (None, None, 2, 1000)
    _code(client.patch(f"/admin/v1/projects/{p['id']}", json={"weight": None}, headers=H), 422)
    _code(client.patch(f"/admin/v1/projects/{p['id']}", json={"name": "ads"}, headers=H), 409)
    # archive: hidden from the list (unless asked), kept by id, cannot be changed or archived twice
    archived = client.delete(f"/admin/v1/projects/{second['id']}", headers=H)
    assert archived.status_code == 200 and archived.json()["status"] == "archived"
    assert [x["name"] for x in client.get(f"/admin/v1/tenants/{tid}/projects", headers=H).json()["data"]] == ["search"]
    every = client.get(f"/admin/v1/tenants/{tid}/projects?include_archived=true", headers=H).json()["data"]
    assert {x["name"]: x["status"] for x in every} == {"search": "active", "ads": "archived"}
    _code(client.patch(f"/admin/v1/projects/{second['id']}", json={"rpm": 1}, headers=H), 409, "project_archived")
    _code(client.delete(f"/admin/v1/projects/{second['id']}", headers=H), 409, "project_archived")
    _code(client.post(f"/admin/v1/tenants/{tid}/projects", json={"name": "ads"}, headers=H), 409)  # name kept
    # every change is in the audit log
    actions = [e["action"] for e in client.get("/admin/v1/audit?limit=1000", headers=H).json()["data"]]
    assert {"project.create", "project.update", "project.archive"} <= set(actions)
    # a deleted tenant's projects are gone with it
    assert client.delete(f"/admin/v1/tenants/{other}", headers=H).status_code == 200
    _code(client.get(f"/admin/v1/tenants/{other}/projects", headers=H), 404)


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"name": ""},
        {"name": "x" * 65},
        {"name": "a b"},
        {"name": "ok", "rpm": 0},
        {"name": "ok", "tpm": -1},
        {"name": "ok", "max_concurrent": 2**40},
        {"name": "ok", "weight": 0},
        {"name": "ok", "weight": "NaN"},
        {"name": "ok", "weight": 1e308},
        {"name": "ok", "priority": -1},
        {"name": "ok", "models": [""]},
        {"name": "ok", "models": "alpha"},
        {"name": "ok", "budget": 5},
    ],
)
def test_bad_project_bodies_are_422(client, bad):
    tid = client.post("/admin/v1/tenants", json={"name": "acme"}, headers=H).json()["id"]
    _code(client.post(f"/admin/v1/tenants/{tid}/projects", json=bad, headers=H), 422)


def test_unknown_ids_are_404(client):
    _code(client.post("/admin/v1/tenants/ten_nope/projects", json={"name": "x"}, headers=H), 404)
    _code(client.get("/admin/v1/tenants/ten_nope/projects", headers=H), 404)
    for method in ("get", "delete"):
        _code(getattr(client, method)("/admin/v1/projects/prj_nope", headers=H), 404)
    _code(client.patch("/admin/v1/projects/prj_nope", json={"rpm": 1}, headers=H), 404)


def test_keys_of_a_project(client, good_files, platform):
    tid = tenant_with_adapters(client, good_files)
    other = client.post("/admin/v1/tenants", json={"name": "other"}, headers=H).json()["id"]
    p = project(client, tid)
    theirs = project(client, other)
    k = key(client, tid, project_id=p["id"])
    assert k["project_id"] == p["id"]
    assert [x["project_id"] for x in client.get(f"/admin/v1/tenants/{tid}/keys", headers=H).json()["data"]] == [p["id"]]
    # another tenant's project answers like a missing one; an archived one is a conflict
    _code(client.post(f"/admin/v1/tenants/{tid}/keys", json={"project_id": theirs["id"]}, headers=H), 404)
    _code(client.post(f"/admin/v1/tenants/{tid}/keys", json={"project_id": "prj_nope"}, headers=H), 404)
    _code(client.post(f"/admin/v1/tenants/{tid}/keys", json={"project_id": ""}, headers=H), 422)
    assert complete(client, k["key"], "alpha").status_code == 200
    # archiving refuses its keys from their next request (the key cache is evicted)
    assert client.delete(f"/admin/v1/projects/{p['id']}", headers=H).status_code == 200
    _code(complete(client, k["key"], "alpha"), 403, "project_archived")
    _code(client.get("/v1/models", headers=admin_headers(k["key"])), 403, "project_archived")
    _code(client.post(f"/admin/v1/tenants/{tid}/keys", json={"project_id": p["id"]}, headers=H), 409)


def test_the_project_allowlist_narrows_the_tenants_and_the_keys(client, good_files, platform):
    tid = tenant_with_adapters(client, good_files)
    base = platform.ctx.engine.model_name
    p = project(client, tid, models=["alpha", base])
    k = key(client, tid, project_id=p["id"])
    narrower = key(client, tid, project_id=p["id"], allowed_models=["beta", base])
    models = lambda s: {m["id"] for m in client.get("/v1/models", headers=admin_headers(s)).json()["data"]}  # noqa: E731
    assert models(k["key"]) == {"alpha", base}
    assert models(narrower["key"]) == {base}  # both the key's and the project's allowlists
    assert complete(client, k["key"], "alpha").status_code == 200
    _code(complete(client, k["key"], "beta"), 403, "model_not_allowed")
    _code(complete(client, narrower["key"], "alpha"), 403, "model_not_allowed")
    _code(complete(client, k["key"], "nope"), 404, "model_not_found")  # the tenant cannot: still 404
    # a change applies from the next request
    assert client.patch(f"/admin/v1/projects/{p['id']}", json={"models": ["beta"]}, headers=H).status_code == 200
    assert models(k["key"]) == {"beta"}
    assert client.patch(f"/admin/v1/projects/{p['id']}", json={"models": None}, headers=H).status_code == 200
    assert models(k["key"]) == {"alpha", "beta", base}


def test_project_limits_on_top_of_the_tenants_and_keys(client, good_files, platform):
    tid = tenant_with_adapters(client, good_files)
    p = project(client, tid, rpm=3)
    k1, k2 = key(client, tid, project_id=p["id"]), key(client, tid, project_id=p["id"])
    outsider = key(client, tid)
    # rpm counts the project's keys together
    assert complete(client, k1["key"], "alpha").status_code == 200
    assert complete(client, k2["key"], "alpha").status_code == 200
    assert client.get("/v1/models", headers=admin_headers(k1["key"])).status_code == 200  # a lookup counts too
    r = complete(client, k2["key"], "alpha")
    _code(r, 429, "rate_limit_exceeded")
    assert r.headers.get("retry-after")
    assert complete(client, outsider["key"], "alpha").status_code == 200  # the tenant is not limited
    events = client.get("/admin/v1/alerts/events?limit=1000", headers=H).json()["data"]
    # the refusal is the project's (its own subject, its tenant named), never the tenant's
    refused = [e for e in events if e["type"] == "limit.refused" and e["data"]["rule"] == "rpm"]
    assert len(refused) == 1, events
    data = refused[0]["data"]
    assert (data["scope"], data["project_id"], data["tenant_id"], data["limit"]) == ("project", p["id"], tid, 3)
    assert refused[0]["tenant_id"] == tid
    # tpm: a request reserving more than the project's tpm is refused and holds nothing anywhere
    small = project(client, tid, name="small", tpm=20)
    ks = key(client, tid, project_id=small["id"], rpm=100)
    _code(complete(client, ks["key"], "alpha", max_tokens=64), 429)
    # a prompt list that can never fit the project's tpm whole: 400 before anything is held
    _code(complete(client, ks["key"], "alpha", max_tokens=4, prompt=["hi"] * 8), 400, "prompt_list_exceeds_limit")
    assert platform.ctx.quotas.running(tid) == 0
    assert platform.ctx.quotas.running(f"key:{ks['id']}") == 0
    assert complete(client, ks["key"], "alpha", max_tokens=2).status_code == 200
    # concurrency: the project's hold is released with each request, n > 1 included
    one = project(client, tid, name="one", max_concurrent=1)
    ko = key(client, tid, project_id=one["id"], max_concurrent=5)
    for n in (1, 2, 1):
        assert complete(client, ko["key"], "alpha", n=n).status_code == 200
    assert platform.ctx.quotas.running(f"project:{one['id']}") == 0
    assert platform.ctx.quotas.running(f"key:{ko['id']}") == 0
    assert platform.ctx.quotas.running(tid) == 0
    # the tenant's own quota still applies to a project with larger limits
    fresh = tenant_with_adapters(client, good_files, name="fresh", adapters=())
    assert client.put(f"/admin/v1/tenants/{fresh}/quota", json={"rpm": 1}, headers=H).status_code == 200
    roomy = project(client, fresh, name="roomy", rpm=100)
    kr = key(client, fresh, project_id=roomy["id"])
    base = platform.ctx.engine.model_name
    assert complete(client, kr["key"], base).status_code == 200
    _code(complete(client, kr["key"], base), 429)


def test_a_tenant_admin_manages_only_its_own_tenants_projects(client, platform):
    mine = client.post("/admin/v1/tenants", json={"name": "mine"}, headers=H).json()["id"]
    theirs = client.post("/admin/v1/tenants", json={"name": "theirs"}, headers=H).json()["id"]
    p_mine, p_theirs = project(client, mine), project(client, theirs)
    actor = Actor("alice@example.com", frozenset({f"tenant_admin:{mine}"}))
    sessions = platform.ctx.sessions

    def check(method, route, path, query=None):
        authorize(actor, method, "/admin/v1" + route, path, query or {}, sessions)

    check("GET", "/tenants/{tenant_id}/projects", {"tenant_id": mine})
    check("POST", "/tenants/{tenant_id}/projects", {"tenant_id": mine})
    for method in ("GET", "PATCH", "DELETE"):
        check(method, "/projects/{project_id}", {"project_id": p_mine["id"]})
        with pytest.raises(Forbidden):
            check(method, "/projects/{project_id}", {"project_id": p_theirs["id"]})
        with pytest.raises(Forbidden):
            check(method, "/projects/{project_id}", {"project_id": "prj_nope"})
    for method in ("GET", "POST"):
        with pytest.raises(Forbidden):
            check(method, "/tenants/{tenant_id}/projects", {"tenant_id": theirs})
