"""Builders and checks shared by the platform tests: PEFT adapters on tiny local models, archives,
attack files, admin-API shortcuts, error-body checks, settings and PostgreSQL databases. Test
modules import from here (or get fixtures from conftest.py), never from each other."""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

import pytest
from harness import postgres
from harness.adapters import adapter_files, make_peft_adapter, zip_bytes  # noqa: F401  (tests import them from here)

ADMIN_KEY = "test-admin-key-0123456789abcdef"
PG_URL = os.environ.get("LORAPLEX_TEST_POSTGRES_URL", "")  # the shared server: each test its own database
REQUIRE_PG = os.environ.get("LORAPLEX_REQUIRE_POSTGRES") == "1"
BACKENDS = [pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)]


def admin_headers(key: str = ADMIN_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def targz_bytes(
    files: dict[str, bytes], *, symlinks: dict[str, str] | None = None, hardlinks: dict[str, str] | None = None
) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tf.addfile(info)
        for name, target in (hardlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.LNKTYPE
            info.linkname = target
            tf.addfile(info)
    return buf.getvalue()


def nan_adapter_files(files: dict[str, bytes]) -> dict[str, bytes]:
    """The same adapter with a NaN in one LoRA weight."""
    from safetensors.torch import load, save

    tensors = load(files["adapter_model.safetensors"])
    name = sorted(tensors)[0]
    t = tensors[name].clone()
    t.view(-1)[0] = float("nan")
    tensors[name] = t
    return {**files, "adapter_model.safetensors": save(tensors)}


def reshaped_adapter_files(files: dict[str, bytes]) -> dict[str, bytes]:
    """The same adapter with one lora_B matrix cut to a shape the base model cannot take."""
    from safetensors.torch import load, save

    tensors = load(files["adapter_model.safetensors"])
    name = next(n for n in sorted(tensors) if "lora_B" in n)
    tensors[name] = tensors[name][:-3].contiguous()
    return {**files, "adapter_model.safetensors": save(tensors)}


def with_config(files: dict[str, bytes], **changes) -> dict[str, bytes]:
    cfg = json.loads(files["adapter_config.json"])
    cfg.update(changes)
    return {**files, "adapter_config.json": json.dumps(cfg).encode()}


# ------------------------------------------------------------------ admin API shortcuts and checks
def assert_error(resp, status: int, *, param: str | None = None, contains: str = "") -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    if param is not None:
        assert err["param"] == param
    assert contains.lower() in err["message"].lower()
    return err


def upload(client, name, data: bytes, *, filename="adapter.zip", headers=None, **fields):
    form = {"name": name, **{k: str(v).lower() if isinstance(v, bool) else v for k, v in fields.items()}}
    return client.post(
        "/admin/v1/adapters",
        data=form,
        files={"file": (filename, data)},
        headers=admin_headers() if headers is None else headers,
    )


def tenant(client, name):
    return client.post("/admin/v1/tenants", json={"name": name}, headers=admin_headers()).json()["id"]


def tenant_key(client, tid):
    return client.post(f"/admin/v1/tenants/{tid}/keys", json={}, headers=admin_headers()).json()["key"]


def models_of(client, key) -> list[str]:
    return [m["id"] for m in client.get("/v1/models", headers=admin_headers(key)).json()["data"]]


def engine_tenant(llm_engine, tenant_id: str) -> dict:
    """The engine's view of a tenant's scheduling fields (whatever object holds them)."""
    info = llm_engine.tenant_info(tenant_id) if hasattr(llm_engine, "tenant_info") else llm_engine.tenants[tenant_id]
    get = info.get if isinstance(info, dict) else lambda k: getattr(info, k)
    return {"priority": get("priority"), "weight": float(get("weight")), "max_running_seqs": get("max_running_seqs")}


# ------------------------------------------------------------------ settings and databases
def need_postgres() -> str:
    if PG_URL:
        return PG_URL
    if REQUIRE_PG:
        pytest.fail("LORAPLEX_REQUIRE_POSTGRES=1 but LORAPLEX_TEST_POSTGRES_URL is not set")
    pytest.skip("LORAPLEX_TEST_POSTGRES_URL is not set")


def pg_create_database(template: str | None = None) -> str:
    return postgres.create_database(need_postgres(), template)


def pg_drop_database(url: str) -> None:
    postgres.drop_database(need_postgres(), url)


def make_settings(tmp_path: Path, db_url: str, **overrides):
    from loraplex.platform.settings import load_settings

    values = dict(
        data_dir=tmp_path / "data",
        database_url=db_url,
        admin_key=ADMIN_KEY,
        engine={"enabled": False},
        uploads={"max_upload_bytes": 2 * 1024 * 1024, "max_members": 8, "max_unpacked_bytes": 4 * 1024 * 1024},
    )
    values.update(overrides)
    # file:// sources in tests are temporary folders; the default root is only <data_dir>/adapter-files
    adapters = dict(values.get("adapters") or {})
    adapters.setdefault("file_roots", [tempfile.gettempdir()])
    values["adapters"] = adapters
    return load_settings(**values)


def run_cli(*args: str):
    """The ``loraplex`` CLI in this process (typer's runner): the result has exit_code and output."""
    from typer.testing import CliRunner

    from loraplex.platform.cli import app

    return CliRunner().invoke(app, list(args))
