"""Adapters registered by reference (s3:// on a real moto server, file://, hf://), fetched on first
use into a byte-budgeted disk cache, served like uploads; hostile objects, a stopped store and a
changed object."""

from __future__ import annotations

import concurrent.futures
import os

import httpx
import openai
import pytest
from harness.s3 import CREDENTIALS, MotoServer, RawStore
from harness.wait import wait_for
from platform_helpers import adapter_files, admin_headers, nan_adapter_files, zip_bytes

from loraplex.platform.adapters.sources.cache import DiskCache

# A real moto server process and several live servers per test.
pytestmark = pytest.mark.slow

H = admin_headers()
PROMPT = "The quick brown fox"
SECRET = "s" * 40  # several servers on one database ("nodes") must hash keys alike


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    srv = MotoServer(tmp_path_factory.mktemp("moto"))
    yield srv
    srv.close()


@pytest.fixture(autouse=True)
def aws_env(monkeypatch):
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)


def _adapters_settings(moto, **extra):
    return {
        "s3_endpoint_url": moto.url,
        "fetch_timeout_s": 15.0,
        "connect_timeout_s": 1.0,
        "read_timeout_s": 3.0,
        **extra,
    }


def _setup(url: str) -> tuple[httpx.Client, str, str]:
    c = httpx.Client(base_url=url, headers=H, timeout=60)
    tid = c.post("/admin/v1/tenants", json={"name": "acme"}).json()["id"]
    key = c.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"]
    return c, tid, key


def _register(c: httpx.Client, name: str, source: str, tid: str | None, **extra) -> httpx.Response:
    body = {"name": name, "source": source, "tenant_id": tid, "visibility": "private" if tid else "shared", **extra}
    return c.post("/admin/v1/adapters", json=body)


def _complete(url: str, key: str, model: str) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
    return r.choices[0].text


def _bucket(request) -> str:
    import hashlib

    return "b-" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:20]


def test_s3_reference_serves_like_an_upload(live_factory, moto, adapter_dirs, good_files, request):
    source = moto.put_folder(_bucket(request), "adapters/good/", good_files)
    srv = live_factory(adapters=_adapters_settings(moto), secret_key=SECRET)
    c, tid, key = _setup(srv.url)
    r = _register(c, "ref-bot", source, tid)
    assert r.status_code == 201, r.text
    ref = r.json()
    up = c.post(
        "/admin/v1/adapters",
        data={"name": "up-bot", "tenant_id": tid},
        files={"file": ("a.zip", zip_bytes(good_files))},
    ).json()
    # the content hash is the same as an upload of the same files; facts read from the files
    assert ref["sha256"] == up["sha256"] and ref["source_uri"] == source
    assert (ref["rank"], ref["alpha"], ref["target_modules"]) == (4, 8, ["q_proj", "v_proj"])
    # lazy: not in the engine until first use
    assert ref["id"] not in srv.ctx.engine.registered_adapters()
    models = [m["id"] for m in c.get("/v1/models", headers=admin_headers(key)).json()["data"]]
    assert {"ref-bot", "up-bot"} <= set(models)
    base = _complete(srv.url, key, srv.ctx.engine.model_name)
    by_ref, by_upload = _complete(srv.url, key, "ref-bot"), _complete(srv.url, key, "up-bot")
    assert by_ref == by_upload and by_ref != base  # the adapter changes the output, identically
    assert ref["id"] in srv.ctx.engine.registered_adapters()


def test_file_reference(live_factory, adapter_dirs, good_files, tmp_path):
    srv = live_factory()
    c, tid, key = _setup(srv.url)
    r = _register(c, "file-bot", f"file://{adapter_dirs['good']}", tid)
    assert r.status_code == 201, r.text
    up = c.post(
        "/admin/v1/adapters", data={"name": "up", "tenant_id": tid}, files={"file": ("a.zip", zip_bytes(good_files))}
    ).json()
    assert up["sha256"] == r.json()["sha256"]
    assert _complete(srv.url, key, "file-bot") == _complete(srv.url, key, "up")
    # a link inside the folder is refused (it could point anywhere on the server)
    evil = tmp_path / "evil"
    evil.mkdir()
    for name, data in good_files.items():
        if name != "README.md":
            (evil / name).write_bytes(data)
    os.symlink("/etc/passwd", evil / "README.md")
    r = _register(c, "evil", f"file://{evil}", tid)
    assert r.status_code == 400 and "link" in r.json()["error"]["message"]
    for bad in ("file://relative/path", "ftp://x/y", "file:///a/../etc", "s3://UPPER/x", "hf://noslash", "x" * 2000):
        r = _register(c, "bad", bad, tid)
        assert r.status_code in (400, 422), (bad, r.text)
        assert r.json()["error"]["param"] in ("source", None), r.text


HOSTILE = {
    "pickle": (lambda g: {**g, "adapter_model.bin": b"\x80\x04K\x01."}, 400, "pickle"),
    "extra_file": (lambda g: {**g, "run.sh": b"rm -rf /"}, 400, "unexpected file"),
    "nested_key": (lambda g: {**g, "sub/adapter_config.json": g["adapter_config.json"]}, 400, "unexpected file"),
    "missing_weights": (lambda g: {"adapter_config.json": g["adapter_config.json"]}, 400, "lacks"),
    "too_big": (lambda g: {**g, "README.md": b"x" * (5 * 1024 * 1024)}, 400, "more than"),
    "nan_weights": (nan_adapter_files, 422, ""),
    "not_json_config": (lambda g: {**g, "adapter_config.json": b"{not json"}, 422, ""),
}


@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_hostile_objects_are_refused(live_factory, moto, good_files, attack, request, db_url):
    if "postgresql" in db_url and attack not in ("pickle", "nan_weights"):
        pytest.skip("the refusals do not depend on the database; two cases run on PostgreSQL")
    make, status, words = HOSTILE[attack]
    source = moto.put_folder(_bucket(request), "x/", make(dict(good_files)))
    srv = live_factory(adapters=_adapters_settings(moto), secret_key=SECRET)
    c, tid, _ = _setup(srv.url)
    r = _register(c, "hostile", source, tid)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"]
    assert c.get("/admin/v1/adapters").json()["data"] == []
    cache = srv.ctx.sources.resolver.cache
    assert len(cache) == 0 or attack in ("nan_weights", "not_json_config")  # refused before caching
    assert not list(cache.staging_root.glob("*"))  # no scratch left behind


def test_missing_source_and_unknown_bucket(live_factory, moto):
    srv = live_factory(adapters=_adapters_settings(moto), secret_key=SECRET)
    c, tid, _ = _setup(srv.url)
    r = _register(c, "nothing", "s3://no-such-bucket-xyz/a/", tid)
    assert r.status_code == 400 and r.json()["error"]["code"] == "source_not_found", r.text
    moto.put_folder("empty-prefix", "real/", {"README.md": b"x"})
    r = _register(c, "nothing", "s3://empty-prefix/other/", tid)
    assert r.status_code == 400 and r.json()["error"]["code"] == "source_not_found", r.text


def test_concurrent_first_requests_share_one_download(live_factory, moto, good_files, request):
    source = moto.put_folder(_bucket(request), "p/", good_files)
    registrar = live_factory(adapters=_adapters_settings(moto), secret_key=SECRET)
    c, tid, key = _setup(registrar.url)
    assert _register(c, "cold", source, tid).status_code == 201
    # a second server on the same database with its own (empty) disk cache: another node
    node = live_factory(adapters=_adapters_settings(moto), secret_key=SECRET)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        texts = list(pool.map(lambda _: _complete(node.url, key, "cold"), range(6)))
    assert len(set(texts)) == 1
    stats = node.ctx.sources.resolver.stats()
    assert stats["downloads"] == 1, stats
    assert texts[0] == _complete(registrar.url, key, "cold")


def test_store_down_cached_adapters_keep_serving(live_factory, tmp_path, good_files, adapter_dirs, request):
    store = MotoServer(tmp_path)
    try:
        warm_src = store.put_folder("warm-bucket", "a/", good_files)
        cold_src = store.put_folder("cold-bucket", "b/", adapter_files(adapter_dirs["good2"]))
        settings = {
            "s3_endpoint_url": store.url,
            "fetch_timeout_s": 8.0,
            "connect_timeout_s": 1.0,
            "read_timeout_s": 2.0,
        }
        registrar = live_factory(adapters=settings, secret_key=SECRET)
        c, tid, key = _setup(registrar.url)
        warm = _register(c, "warm", warm_src, tid)
        assert warm.status_code == 201
        assert _register(c, "cold", cold_src, tid).status_code == 201
        node = live_factory(adapters=settings, secret_key=SECRET)
        before = _complete(node.url, key, "warm")  # fetched into this node's cache
        store.stop()
        assert _complete(node.url, key, "warm") == before  # registered: the store is not asked
        # forgotten by the serving layer (as after a restart): found in the disk cache by its
        # content hash, without asking the store
        hits = node.ctx.sources.resolver.counters["cache_hits"]
        node.ctx.sources.forget(warm.json()["id"])
        assert _complete(node.url, key, "warm") == before
        assert node.ctx.sources.resolver.counters["cache_hits"] == hits + 1
        client = openai.OpenAI(base_url=node.url + "/v1", api_key=key, max_retries=0, timeout=120)
        with pytest.raises(openai.APIStatusError) as err:
            client.completions.create(model="cold", prompt=PROMPT, max_tokens=4)
        assert err.value.status_code == 503
        body = err.value.response.json()["error"]
        assert body["code"] == "model_unavailable" and "cold" in body["message"], body
        assert err.value.response.headers.get("retry-after")
        # admin registration with the store down: a clear 503, nothing registered
        r = _register(c, "later", cold_src, tid)
        assert r.status_code == 503 and r.json()["error"]["code"] == "source_unavailable", r.text
        store.start()  # the store is back (moto keeps objects in memory: put them again)
        store.put_folder("cold-bucket", "b/", adapter_files(adapter_dirs["good2"]))
        assert _complete(node.url, key, "cold") != before
    finally:
        store.close()


def test_changed_object_is_a_new_version(live_factory, moto, good_files, adapter_dirs, request):
    bucket = _bucket(request)
    source = moto.put_folder(bucket, "v/", good_files)
    other = adapter_files(adapter_dirs["good2"])
    srv = live_factory(adapters=_adapters_settings(moto), secret_key=SECRET)
    # another node on the same database, started before the upload below (uploads need a shared
    # store folder; it would mark the upload unavailable at its start)
    node = live_factory(adapters=_adapters_settings(moto), secret_key=SECRET)
    c, tid, key = _setup(srv.url)
    v1 = _register(c, "moving", source, tid).json()
    up2 = c.post(
        "/admin/v1/adapters", data={"name": "up2", "tenant_id": tid}, files={"file": ("a.zip", zip_bytes(other))}
    ).json()
    text_v1 = _complete(srv.url, key, "moving")
    moto.client().delete_object(Bucket=bucket, Key="v/adapter_config.json")
    moto.client().delete_object(Bucket=bucket, Key="v/adapter_model.safetensors")
    moto.put_folder(bucket, "v/", other)
    # a node that has never served it finds new content on first use: a new version, served at once
    text_v2 = _complete(node.url, key, "moving")
    assert text_v2 == _complete(srv.url, key, "up2") != text_v1
    listed = c.get("/admin/v1/adapters", params={"include_superseded": True}).json()["data"]
    moving = sorted((a["version"], a["status"], a["sha256"]) for a in listed if a["name"] == "moving")
    assert moving == [(1, "superseded", v1["sha256"]), (2, "active", up2["sha256"])]
    # the first server follows (the old version left its engine); refresh with no change is a no-op
    assert _complete(srv.url, key, "moving") == text_v2
    v2_id = next(a["id"] for a in listed if a["name"] == "moving" and a["version"] == 2)
    r = c.post(f"/admin/v1/adapters/{v2_id}/refresh")
    assert r.status_code == 200 and r.json()["version"] == 2


def test_disk_cache_is_lru_within_its_byte_budget(tmp_path):
    evicted: list[str] = []
    cache = DiskCache(tmp_path / "c", max_bytes=250, on_evict=evicted.append)
    shas = [f"{i:064x}" for i in range(4)]

    def put(i: int, size: int = 100) -> None:
        with cache.staging() as scratch:
            d = scratch / "f"
            d.mkdir()
            (d / "adapter_model.safetensors").write_bytes(b"x" * size)
            cache.put(d, shas[i])

    put(0)
    put(1)
    assert cache.get(shas[0]) is not None  # 0 is now more recently used than 1
    put(2)
    assert evicted == [shas[1]] and cache.used_bytes == 200 and shas[1] not in cache
    assert not (tmp_path / "c" / shas[1]).exists()
    put(3)
    assert evicted == [shas[1], shas[0]]
    # a restart finds the entries on disk and keeps the budget
    again = DiskCache(tmp_path / "c", max_bytes=150)
    assert len(again) == 1 and again.used_bytes == 100
    with pytest.raises(Exception, match="larger than the whole disk cache"):
        put(0, size=300)
    # entries the engine may still read are never removed under it (the budget waits for them)
    pinned = {shas[3]}
    cache.pinned = lambda: set(pinned)
    put(1)
    put(0)
    assert shas[3] in cache and (tmp_path / "c" / shas[3]).is_dir()
    assert evicted[-2:] == [shas[2], shas[1]] and cache.used_bytes == 200
    pinned.clear()
    put(2)
    assert evicted[-1] == shas[3]


def _fake_hub_cache(root, repo: str, files: dict[str, bytes]) -> str:
    """huggingface_hub's cache layout (refs, snapshots linking into blobs), as a download leaves it."""
    import hashlib

    commit = hashlib.sha1(repo.encode()).hexdigest()
    base = root / ("models--" + repo.replace("/", "--"))
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    (base / "blobs").mkdir()
    snap = base / "snapshots" / commit
    snap.mkdir(parents=True)
    for name, data in files.items():
        blob = hashlib.sha256(data).hexdigest()
        (base / "blobs" / blob).write_bytes(data)
        os.symlink(f"../../blobs/{blob}", snap / name)
    return commit


def test_hf_reference_through_the_hub_cache(live_factory, good_files, tmp_path):
    hub = tmp_path / "hub"
    _fake_hub_cache(hub, "acme/sql-lora", good_files)
    srv = live_factory(adapters={"hf_cache_dir": str(hub), "hf_offline": True})
    c, tid, key = _setup(srv.url)
    r = _register(c, "hub-bot", "hf://acme/sql-lora", tid)
    assert r.status_code == 201, r.text
    up = c.post(
        "/admin/v1/adapters", data={"name": "up", "tenant_id": tid}, files={"file": ("a.zip", zip_bytes(good_files))}
    ).json()
    assert r.json()["sha256"] == up["sha256"]
    assert _complete(srv.url, key, "hub-bot") == _complete(srv.url, key, "up")
    # not cached, hub unreachable (offline): a clear 503, not a hang or a 500
    r = _register(c, "missing", "hf://acme/not-cached@main", tid)
    assert r.status_code == 503 and r.json()["error"]["code"] == "source_unavailable", r.text
    assert "offline" in r.json()["error"]["message"]
    # a snapshot link pointing outside the hub cache is refused
    evil = tmp_path / "hub2"
    commit = _fake_hub_cache(evil, "acme/evil", good_files)
    link = evil / "models--acme--evil" / "snapshots" / commit / "README.md"
    link.unlink()
    os.symlink("/etc/passwd", link)
    srv2 = live_factory(adapters={"hf_cache_dir": str(evil), "hf_offline": True})
    r = httpx.post(
        srv2.url + "/admin/v1/adapters",
        json={"name": "evil", "source": "hf://acme/evil", "visibility": "shared"},
        headers=H,
        timeout=60,
    )
    assert r.status_code == 400 and "outside" in r.json()["error"]["message"], r.text


def test_a_store_that_never_answers_gives_503_within_the_fetch_timeout(live_factory, moto, good_files, request):
    """A black hole (accepts connections, never answers): the request is answered 503 after
    fetch_timeout_s, not held until the client gives up."""
    source = moto.put_folder(_bucket(request), "slow/", good_files)
    registrar = live_factory(adapters=_adapters_settings(moto), secret_key=SECRET)
    c, tid, key = _setup(registrar.url)
    assert _register(c, "slow", source, tid).status_code == 201
    hole = RawStore("hole")
    try:
        node = live_factory(
            adapters={
                "s3_endpoint_url": hole.url,
                "fetch_timeout_s": 2.0,
                "read_timeout_s": 60.0,
                "s3_max_attempts": 1,
            },
            secret_key=SECRET,
        )
        client = openai.OpenAI(base_url=node.url + "/v1", api_key=key, max_retries=0, timeout=300)
        with pytest.raises(openai.APIStatusError) as err:
            client.completions.create(model="slow", prompt=PROMPT, max_tokens=4)
        assert err.value.status_code == 503
        body = err.value.response.json()["error"]
        assert body["code"] == "model_unavailable" and "longer than 2s" in body["message"], body
        # It really was the store it waited on: the download goes on after the 503, so the black hole
        # sees its connection even when a loaded machine took the whole timeout to build the client.
        wait_for(lambda: hole.accepted, what="the download's connection to the black hole")
    finally:
        hole.close()


def test_cold_reference_meets_n_streaming_schema_quota_and_hostile_names(live_factory, moto, good_files, request):
    """An S3 adapter's FIRST use arrives as concurrent n = 3 streaming json_schema requests under a tpm
    limit, next to a hostile model name: every answer parses, one download, the limit holds."""
    import json

    source = moto.put_folder(_bucket(request), "combo/", good_files)
    srv = live_factory(adapters=_adapters_settings(moto), secret_key=SECRET)
    c, tid, key = _setup(srv.url)
    downloads_before = srv.ctx.sources.resolver.counters["downloads"]
    assert _register(c, "combo-bot", source, tid).status_code == 201
    assert c.put(f"/admin/v1/tenants/{tid}/quota", json={"tpm": 400}).status_code == 200
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, timeout=120)

    def one(_):
        try:
            stream = client.chat.completions.create(
                model="combo-bot",
                messages=[{"role": "user", "content": "hi"}],
                n=3,
                max_tokens=12,
                stream=True,
                response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
            )
            texts = ["", "", ""]
            for chunk in stream:
                for ch in chunk.choices:
                    texts[ch.index] += ch.delta.content or ""
            return texts
        except openai.RateLimitError:
            return None

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(6)))
    served = [r for r in results if r is not None]
    assert served, results  # the first requests of a cold adapter are answered, not 503/500
    for texts in served:
        for t in texts:  # a choice cut by max_tokens is a JSON prefix; a finished one parses
            assert t and t.lstrip().startswith("{")
            if t.rstrip().endswith("}"):
                assert isinstance(json.loads(t)["ok"], bool)
    # one download in all: registration's (it validates the files); first use comes from the disk cache
    assert srv.ctx.sources.resolver.counters["downloads"] - downloads_before == 1
    # prompt + n x max_tokens is reserved: the tpm limit admits at most what it can pay for
    assert len(served) * 3 * 12 <= 400
    bad = httpx.post(
        srv.url + "/v1/chat/completions",
        content=b'{"model": "combo-bot\\ud800", "messages": [{"role": "user", "content": "hi"}]}',
        headers={**admin_headers(key), "content-type": "application/json"},
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_text"
