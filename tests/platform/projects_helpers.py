"""Helpers of the projects tests (platform/projects): a tenant with two adapters, projects, keys."""

from __future__ import annotations

from platform_helpers import admin_headers, zip_bytes

H = admin_headers()


def tenant_with_adapters(client, good_files, name="acme", adapters=("alpha", "beta")) -> str:
    tid = client.post("/admin/v1/tenants", json={"name": name}, headers=H).json()["id"]
    for a in adapters:
        r = client.post(
            "/admin/v1/adapters",
            data={"name": a, "tenant_id": tid},
            files={"file": ("a.zip", zip_bytes(good_files))},
            headers=H,
        )
        assert r.status_code == 201, r.text
    return tid


def project(client, tid, **body) -> dict:
    body.setdefault("name", "team")
    r = client.post(f"/admin/v1/tenants/{tid}/projects", json=body, headers=H)
    assert r.status_code == 201, r.text
    return r.json()


def key(client, tid, **body) -> dict:
    r = client.post(f"/admin/v1/tenants/{tid}/keys", json=body, headers=H)
    assert r.status_code == 201, r.text
    return r.json()


def complete(client, secret, model, max_tokens=2, **extra):
    body = {"model": model, "prompt": "hi", "max_tokens": max_tokens, "temperature": 0, **extra}
    return client.post("/v1/completions", json=body, headers=admin_headers(secret))
