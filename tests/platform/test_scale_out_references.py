"""Adapters registered by reference under ``loraplex serve --replicas 2``: no shared filesystem.

A real local Ray (``ServeCluster``), a real S3-compatible store (moto's standalone server, which
records every request it serves), and engine replicas whose data directory
(``[cluster] replica_data_dir``) is not the ingress's; each replica keeps its adapter cache in a
folder of its own. What is asserted, with the store's own request log as the oracle:

- serving never downloads at the ingress: its one download is the registration's (it reads the
  files to check them and hash them), and requests on both replicas add none, nor a cache hit;
- each replica downloads the adapter once, into its own cache folder (none into another's or the
  ingress's), and serves the same greedy text, which differs from the base model's.

Before the fix, the ingress decided "the engine is remote" with ``isinstance`` of a class deleted
long before: the check was always false, the ingress served the adapter from ITS cache and handed
the replicas its local path, so the replicas downloaded nothing and read the ingress's folder (on
two nodes: a path that does not exist there; on one: gone when the ingress's cache evicts it).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from pathlib import Path
from unittest import mock

import httpx
import pytest
from billing_helpers import H, auth, new_tenant
from harness.ray import ServeCluster
from platform_helpers import ADMIN_KEY
from s3_helpers import CREDENTIALS, MotoServer

pytest.importorskip("ray.serve", reason="the scale-out tests need loraplex[ray]")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

WAIT_S = 180  # bounds a wait on a loaded 2-core box; nothing here measures time
WEIGHTS = "adapter_model.safetensors"
BODY = {"prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0}


class RecordingMoto(MotoServer):
    """moto's server with its request recorder on (every request but the recorder's own)."""

    def __init__(self, log_dir: Path) -> None:
        self.recording = log_dir / "moto-recording.jsonl"
        super().__init__(log_dir)

    def start(self) -> None:
        env = {"MOTO_ENABLE_RECORDING": "1", "MOTO_RECORDER_FILEPATH": str(self.recording)}
        with mock.patch.dict(os.environ, env):
            super().start()

    def gets_of(self, key_suffix: str) -> int:
        """GET requests for an object whose key ends with ``key_suffix`` (downloads of it)."""
        text = httpx.get(self.url + "/moto-api/recorder/download-recording", timeout=30).text
        entries = [json.loads(line) for line in text.splitlines() if line.strip()]
        return sum(1 for e in entries if e["method"] == "GET" and e["url"].split("?")[0].endswith(key_suffix))


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    srv = RecordingMoto(tmp_path_factory.mktemp("moto"))
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def replica_data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("replica-data")


@pytest.fixture(scope="module")
def cluster(demo_model_dir, tmp_path_factory, moto, replica_data_dir):
    config = f"""
[engine]
kv_cache_memory_gb = 0.05
max_num_seqs = 8
max_loras = 2
max_lora_rank = 16
[adapters]
s3_endpoint_url = "{moto.url}"
fetch_timeout_s = 60.0
[cluster]
replicas = 2
ingress_replicas = 1
replica_num_cpus = 0.5
ingress_num_cpus = 0.25
sync_interval_s = 0.5
routing = "load"
replica_data_dir = "{replica_data_dir}"
"""
    c = ServeCluster(
        tmp_path_factory.mktemp("cluster"), demo_model_dir, config, admin_key=ADMIN_KEY, env=dict(CREDENTIALS)
    )
    yield c
    c.stop()


def _ingress_counters(url: str) -> dict[str, float]:
    """The ingress's adapter-fetch counters, from its /metrics."""
    text = httpx.get(url + "/metrics", headers=H, timeout=WAIT_S).text
    got = {}
    for name in ("downloads", "cache_hits"):
        m = re.search(rf"^loraplex:adapter_store_{name}_total (\S+)$", text, re.MULTILINE)
        assert m, text[:2000]
        got[name] = float(m.group(1))
    return got


def _cache_entries(root: Path) -> set[str]:
    """Adapter contents (folders named by their sha256) directly under a cache folder."""
    return {p.name for p in root.iterdir() if p.is_dir() and len(p.name) == 64} if root.is_dir() else set()


async def _completions(url: str, key: str, model: str, n: int) -> list[tuple[str, str]]:
    """n simultaneous requests; (replica, text) of each."""
    async with httpx.AsyncClient(base_url=url, headers=auth(key), timeout=WAIT_S) as c:
        rs = await asyncio.gather(*[c.post("/v1/completions", json={**BODY, "model": model}) for _ in range(n)])
    for r in rs:
        assert r.status_code == 200, r.text
    return [(r.headers["x-loraplex-replica"], r.json()["choices"][0]["text"]) for r in rs]


def test_each_replica_fetches_a_reference_itself_and_the_ingress_never_downloads_to_serve(
    cluster, moto, good_files, replica_data_dir
):
    source = moto.put_folder("refs", "adapters/good/", good_files)
    tid, key = new_tenant(cluster.url, "refs", timeout=WAIT_S)
    r = httpx.post(
        cluster.url + "/admin/v1/adapters",
        json={"name": "ref-bot", "source": source, "tenant_id": tid, "visibility": "private"},
        headers=H,
        timeout=WAIT_S,
    )
    assert r.status_code == 201, r.text
    sha = r.json()["sha256"]
    # registration reads the files once at the ingress (to check and hash them): the baseline
    assert moto.gets_of("adapters/good/" + WEIGHTS) == 1
    registered = _ingress_counters(cluster.url)
    assert registered["downloads"] == 1
    ingress_cache = cluster.data_dir / "adapter-cache"
    assert _cache_entries(ingress_cache) == {sha}

    base = {text for _, text in asyncio.run(_completions(cluster.url, key, cluster.engine()["model"], 2))}
    # requests until both replicas have served the adapter (routing = "load" spreads them)
    served: dict[str, set[str]] = {}
    deadline = time.monotonic() + WAIT_S
    while len(served) < 2:
        assert time.monotonic() < deadline, f"the adapter's requests reached only {sorted(served)}"
        for replica, text in asyncio.run(_completions(cluster.url, key, "ref-bot", 6)):
            served.setdefault(replica, set()).add(text)
    texts = set().union(*served.values())
    assert len(texts) == 1 and texts != base, (served, base)  # the adapter, identically on both

    # the store's own log: one download per replica, none more for the ingress
    assert moto.gets_of("adapters/good/" + WEIGHTS) == 1 + 2
    assert _ingress_counters(cluster.url) == registered  # not a download, not even a cache hit
    assert _cache_entries(ingress_cache) == {sha}
    # (a replica reports its counters with its heartbeat: wait for the report after its fetch)
    reps = cluster.replicas()
    while not all(r["adapter_sources"].get("downloads", 0) >= 1 for r in reps):
        assert time.monotonic() < deadline + WAIT_S, reps
        time.sleep(0.2)
        reps = cluster.replicas()
    assert sorted(r["replica"] for r in reps) == sorted(served)
    assert [r["adapter_sources"]["downloads"] for r in reps] == [1, 1], reps
    # each replica's own cache folder, on the replicas' data dir (none under the ingress's)
    parent = replica_data_dir / "adapter-cache" / "replicas"
    assert {p.name for p in parent.iterdir()} == set(served)
    for name in served:
        assert _cache_entries(parent / name) == {sha}
    assert not (ingress_cache / "replicas").exists()
