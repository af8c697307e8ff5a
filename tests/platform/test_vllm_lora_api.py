"""vLLM's dynamic LoRA API (/v1/load_lora_adapter, /v1/unload_lora_adapter) on a real server:
admin key only, then the adapter serves every tenant through the official openai client."""

from __future__ import annotations

import tempfile

import httpx
import openai
from platform_helpers import admin_headers, zip_bytes

H = admin_headers()


def _complete(url: str, key: str, model: str) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)
    return client.completions.create(model=model, prompt="Once upon", max_tokens=6, temperature=0).choices[0].text


def test_load_serve_replace_unload(live_factory, adapter_dirs, good_files):
    srv = live_factory()
    c = httpx.Client(base_url=srv.url, timeout=60)
    tid = c.post("/admin/v1/tenants", json={"name": "acme"}, headers=H).json()["id"]
    key = c.post(f"/admin/v1/tenants/{tid}/keys", json={}, headers=H).json()["key"]
    good, good2 = str(adapter_dirs["good"]), str(adapter_dirs["good2"])
    # a tenant key cannot load adapters; neither can nobody
    r = c.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": good}, headers=admin_headers(key))
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    assert c.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": good}).status_code == 401
    # vLLM's request and answer, byte for byte what its clients parse
    r = c.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": good}, headers=H)
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'sql' added successfully.", r.text
    loaded = next(a for a in c.get("/admin/v1/adapters", headers=H).json()["data"] if a["name"] == "sql")
    assert loaded["visibility"] == "shared" and loaded["source_uri"] == f"file://{good}"
    assert loaded["id"] in srv.ctx.engine.registered_adapters()  # loaded now, as vLLM does
    up = c.post(
        "/admin/v1/adapters",
        data={"name": "up", "visibility": "shared"},
        files={"file": ("a.zip", zip_bytes(good_files))},
        headers=H,
    )
    assert up.status_code == 201
    assert _complete(srv.url, key, "sql") == _complete(srv.url, key, "up")
    assert "sql" in {m["id"] for m in c.get("/v1/models", headers=admin_headers(key)).json()["data"]}
    # loading the same name again is refused; load_inplace replaces it (a new version)
    r = c.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": good2}, headers=H)
    assert r.status_code == 400 and "already been loaded" in r.json()["error"]["message"]
    before = _complete(srv.url, key, "sql")
    r = c.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": good2, "load_inplace": True}, headers=H)
    assert r.status_code == 200, r.text
    assert _complete(srv.url, key, "sql") != before
    # bad paths: clear 4xx, never 500
    for bad in ("relative/dir", "/no/such/dir", "ftp://x/y", ""):
        r = c.post("/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": bad}, headers=H)
        assert 400 <= r.status_code < 500 and "error" in r.json(), (bad, r.text)
    # unload: gone for tenants; unloading again is a 404
    r = c.post("/v1/unload_lora_adapter", json={"lora_name": "sql"}, headers=H)
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'sql' removed successfully."
    r = c.post("/v1/completions", json={"model": "sql", "prompt": "x", "max_tokens": 1}, headers=admin_headers(key))
    assert r.status_code == 404
    assert c.post("/v1/unload_lora_adapter", json={"lora_name": "sql"}, headers=H).status_code == 404
    # deleting a by-reference adapter never touches the upload store (it has no folder there)
    assert list(srv.ctx.store.root.glob("??/*")) and _complete(srv.url, key, "up")


def test_vllm_semantics_reload_after_unload_and_private_names(live_factory, adapter_dirs, good_files, tmp_path):
    """vLLM forgets an unloaded name (loading it again just works, whatever versions came before);
    a tenant's private adapter is neither replaced nor removed through vLLM's API."""
    srv = live_factory()
    c = httpx.Client(base_url=srv.url, timeout=60, headers=H)
    tid = c.post("/admin/v1/tenants", json={"name": "acme"}).json()["id"]
    key = c.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"]
    good, good2 = str(adapter_dirs["good"]), str(adapter_dirs["good2"])

    def load(name: str, path: str, **extra) -> httpx.Response:
        return c.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path, **extra})

    def unload(name: str) -> httpx.Response:
        return c.post("/v1/unload_lora_adapter", json={"lora_name": name})

    # load -> unload -> load: the second load is a plain load (vLLM has no new_version)
    assert load("sql", good).status_code == 200
    first = _complete(srv.url, key, "sql")
    assert unload("sql").status_code == 200
    r = load("sql", good)
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'sql' added successfully.", r.text
    assert _complete(srv.url, key, "sql") == first
    # ... also after in-place replacements left older versions behind
    assert load("sql", good2, load_inplace=True).status_code == 200
    assert unload("sql").status_code == 200
    assert (
        c.post(
            "/v1/completions", json={"model": "sql", "prompt": "x", "max_tokens": 1}, headers=admin_headers(key)
        ).status_code
        == 404
    )
    assert load("sql", good2).status_code == 200
    assert _complete(srv.url, key, "sql") != first
    # ... and after the admin API deleted the served version (the superseded one stayed)
    assert load("sql", good, load_inplace=True).status_code == 200
    served = next(a for a in c.get("/admin/v1/adapters").json()["data"] if a["name"] == "sql")
    assert c.delete(f"/admin/v1/adapters/{served['id']}").status_code == 200
    assert load("sql", good).status_code == 200, "an older superseded version must not block a load"

    # a tenant's private adapter: unload and load_inplace refuse it, it keeps serving its owner
    up = c.post(
        "/admin/v1/adapters", data={"name": "mine", "tenant_id": tid}, files={"file": ("a.zip", zip_bytes(good_files))}
    )
    assert up.status_code == 201, up.text
    for r in (unload("mine"), load("mine", good2, load_inplace=True)):
        assert r.status_code == 400 and r.json()["error"]["param"] == "lora_name", r.text
        assert "private" in r.json()["error"]["message"]
    assert load("mine", good2).status_code == 400  # already loaded (vLLM's answer), not replaced
    assert _complete(srv.url, key, "mine") == first
    mine = [a for a in c.get("/admin/v1/adapters?include_superseded=true").json()["data"] if a["name"] == "mine"]
    assert [a["visibility"] for a in mine] == ["private"]

    # errors name no server-side file: not the data dir, the adapter cache or a temp folder
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{not json")
    (broken / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    empty = tmp_path / "empty"
    empty.mkdir()
    server_paths = [str(srv.ctx.settings.data_dir.resolve()), str(srv.ctx.store.root), tempfile.gettempdir()]
    for name, path in (("b1", broken), ("b2", empty), ("b3", adapter_dirs["wrong_base"]), ("b4", tmp_path / "none")):
        r = load(name, str(path))
        assert 400 <= r.status_code < 500, (path, r.text)
        message = r.json()["error"]["message"]
        leaked = [p for p in server_paths if p in message.replace(str(path), "<the caller's path>")]
        assert not leaked, (path, message)
