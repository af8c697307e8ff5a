"""Per-key scopes: a key limited to some models (``/v1/models`` lists only those; others get 403)
and rpm / tpm / concurrency limits of its own on top of its tenant's."""

from __future__ import annotations

from platform_helpers import admin_headers, zip_bytes
from platform_helpers import assert_error as _assert_error


def assert_error(resp, status: int, *, param: str | None = None, code: str | None = None) -> dict:
    err = _assert_error(resp, status, param=param)
    if code is not None:
        assert err["code"] == code, err
    return err


H = admin_headers()


def _setup(client, good_files):
    tid = client.post("/admin/v1/tenants", json={"name": "acme"}, headers=H).json()["id"]
    for name in ("alpha", "beta"):
        r = client.post(
            "/admin/v1/adapters",
            data={"name": name, "tenant_id": tid},
            files={"file": ("a.zip", zip_bytes(good_files))},
            headers=H,
        )
        assert r.status_code == 201, r.text
    return tid


def _key(client, tid, **scope):
    r = client.post(f"/admin/v1/tenants/{tid}/keys", json=scope, headers=H)
    assert r.status_code == 201, r.text
    return r.json()


def _models(client, key) -> set[str]:
    return {m["id"] for m in client.get("/v1/models", headers=admin_headers(key)).json()["data"]}


def _complete(client, key, model, max_tokens=2):
    body = {"model": model, "prompt": "hi", "max_tokens": max_tokens, "temperature": 0}
    return client.post("/v1/completions", json=body, headers=admin_headers(key))


def test_key_limited_to_models(platform, client, good_files):
    tid = _setup(client, good_files)
    base = platform.ctx.engine.model_name
    full = _key(client, tid)
    scoped = _key(client, tid, allowed_models=["alpha"])
    assert scoped["allowed_models"] == ["alpha"]
    assert _models(client, full["key"]) == {base, "alpha", "beta"}
    assert _models(client, scoped["key"]) == {"alpha"}
    assert _complete(client, scoped["key"], "alpha").status_code == 200
    for model in ("beta", base):
        assert_error(_complete(client, scoped["key"], model), 403, param="model", code="model_not_allowed")
    # a model the tenant cannot use at all stays a 404 (the scope does not reveal it)
    assert_error(_complete(client, scoped["key"], "nope"), 404, code="model_not_found")
    # widening the scope applies from the key's next request (the key cache is evicted)
    r = client.put(f"/admin/v1/keys/{scoped['id']}/scope", json={"allowed_models": ["beta", base]}, headers=H)
    assert r.status_code == 200 and r.json()["allowed_models"] == sorted(["beta", base])
    assert _models(client, scoped["key"]) == {base, "beta"}
    assert _complete(client, scoped["key"], base).status_code == 200
    assert_error(_complete(client, scoped["key"], "alpha"), 403, code="model_not_allowed")
    # cleared: everything the tenant may use
    assert client.put(f"/admin/v1/keys/{scoped['id']}/scope", json={}, headers=H).status_code == 200
    assert _models(client, scoped["key"]) == {base, "alpha", "beta"}


def test_bad_scopes_are_refused(platform, client, good_files):
    tid = _setup(client, good_files)
    for bad in ({"rpm": 0}, {"tpm": -1}, {"max_concurrent": 2**40}, {"allowed_models": [""]}, {"allowed_models": "x"}):
        assert_error(client.post(f"/admin/v1/tenants/{tid}/keys", json=bad, headers=H), 422)
    assert_error(client.put("/admin/v1/keys/key_nope/scope", json={}, headers=H), 404)


def test_key_limits_on_top_of_the_tenant(platform, client, good_files):
    tid = _setup(client, good_files)
    limited = _key(client, tid, rpm=2)["key"]
    other = _key(client, tid)["key"]
    assert _complete(client, limited, "alpha").status_code == 200
    assert _complete(client, limited, "alpha").status_code == 200
    r = _complete(client, limited, "alpha")
    assert_error(r, 429, code="rate_limit_exceeded")
    assert r.headers.get("retry-after")
    assert _complete(client, other, "alpha").status_code == 200  # the tenant itself is not limited
    # tpm: a request reserving more than the key's tpm is refused, and gives the tenant's hold back
    small = _key(client, tid, tpm=20)["key"]
    assert_error(_complete(client, small, "alpha", max_tokens=64), 429)
    assert platform.ctx.quotas.running(tid) == 0
    # concurrency: the key's hold is released with the request (sequential requests never pile up)
    one = _key(client, tid, max_concurrent=1)
    for _ in range(3):
        assert _complete(client, one["key"], "alpha").status_code == 200
    assert platform.ctx.quotas.running(f"key:{one['id']}") == 0
    assert platform.ctx.quotas.running(tid) == 0
    # the tenant's own quota still applies to a key with larger limits of its own
    small_tenant = client.post("/admin/v1/tenants", json={"name": "small"}, headers=H).json()["id"]
    assert client.put(f"/admin/v1/tenants/{small_tenant}/quota", json={"rpm": 1}, headers=H).status_code == 200
    roomy = _key(client, small_tenant, rpm=100)["key"]
    base = platform.ctx.engine.model_name
    assert _complete(client, roomy, base).status_code == 200
    assert_error(_complete(client, roomy, base), 429)
