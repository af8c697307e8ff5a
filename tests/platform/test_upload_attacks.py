"""Hostile or broken uploads: each is refused with a clear message, leaves nothing in the store or
the database, and the server keeps serving."""

from __future__ import annotations

import io
import os
import zipfile

import pytest
from platform_helpers import (
    adapter_files,
    admin_headers,
    assert_error,
    nan_adapter_files,
    reshaped_adapter_files,
    targz_bytes,
    tenant,
    upload,
    with_config,
    zip_bytes,
)
from sqlalchemy import func, select

from loraplex.platform.adapters.models import Adapter

H = admin_headers()
MiB = 1024 * 1024


def _zip_bomb(good: dict[str, bytes]) -> bytes:
    # 64 MiB of zeros compress to ~64 KiB; the unpack limit in these tests is 4 MiB.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("adapter_config.json", good["adapter_config.json"])
        with zf.open("adapter_model.safetensors", "w", force_zip64=True) as f:
            chunk = bytes(MiB)
            for _ in range(64):
                f.write(chunk)
    return buf.getvalue()


ATTACKS = {
    # name: (builder(good_files, adapter_dirs) -> bytes, status, words expected in the message)
    "zip_slip": (lambda g, d: zip_bytes({**g, "../../evil.txt": b"x"}), 400, ".."),
    "tar_slip": (lambda g, d: targz_bytes({**g, "a/../../evil.txt": b"x"}), 400, ".."),
    "absolute_path": (lambda g, d: zip_bytes({**g, "/etc/cron.d/evil": b"x"}), 400, "absolute"),
    "tar_absolute_path": (lambda g, d: targz_bytes({**g, "/tmp/evil": b"x"}), 400, "absolute"),
    "windows_path": (lambda g, d: zip_bytes({**g, "..\\evil": b"x"}), 400, "invalid path"),
    "zip_symlink": (lambda g, d: zip_bytes(g, symlinks={"README.md": "/etc/passwd"}), 400, "link"),
    "tar_symlink": (lambda g, d: targz_bytes(g, symlinks={"README.md": "/etc/passwd"}), 400, "link"),
    "tar_hardlink": (lambda g, d: targz_bytes(g, hardlinks={"README.md": "/etc/passwd"}), 400, "link"),
    "zip_bomb": (lambda g, d: _zip_bomb(g), 413, "unpacks to more than"),
    "too_many_members": (lambda g, d: zip_bytes({**g, **{f"x{i}/README.md": b"" for i in range(10)}}), 400, "members"),
    "pickle_bin": (
        lambda g, d: zip_bytes(
            {"adapter_config.json": g["adapter_config.json"], "adapter_model.bin": b"\x80\x04cos\nsystem\n."}
        ),
        400,
        "pickle",
    ),
    "pickle_next_to_safetensors": (lambda g, d: zip_bytes({**g, "adapter_model.bin": b"\x80\x04."}), 400, "pickle"),
    "unexpected_file": (lambda g, d: zip_bytes({**g, "run.sh": b"rm -rf /"}), 400, "unexpected file"),
    "missing_weights": (lambda g, d: zip_bytes({"adapter_config.json": g["adapter_config.json"]}), 400, "lacks"),
    "wrong_shapes": (lambda g, d: zip_bytes(reshaped_adapter_files(g)), 422, "shape"),
    "wrong_base_model": (lambda g, d: zip_bytes(adapter_files(d["wrong_base"])), 422, ""),
    "nan_weights": (lambda g, d: zip_bytes(nan_adapter_files(g)), 422, "nan"),
    "rank_too_high": (lambda g, d: zip_bytes(with_config(g, r=64)), 422, ""),
    "corrupt_safetensors": (lambda g, d: zip_bytes({**g, "adapter_model.safetensors": b"\x00" * 64}), 422, ""),
    "bad_config_json": (lambda g, d: zip_bytes({**g, "adapter_config.json": b"{not json"}), 422, "json"),
    "empty_file": (lambda g, d: b"", 400, "empty"),
    "not_an_archive": (lambda g, d: os.urandom(4096), 400, "not a .zip or .tar.gz"),
    "truncated_zip": (lambda g, d: zip_bytes(g)[:200], 400, "corrupt"),
    "truncated_tar_gz": (lambda g, d: targz_bytes(g)[:200], 400, "corrupt"),
    "huge_file": (lambda g, d: b"PK\x03\x04" + os.urandom(3 * MiB), 413, "larger than"),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_upload_attack_is_refused_and_leaves_nothing(platform, client, good_files, adapter_dirs, attack):
    build, status, words = ATTACKS[attack]
    acme = tenant(client, "acme")
    resp = upload(client, "victim", build(good_files, adapter_dirs), tenant_id=acme)
    err = assert_error(resp, status)
    assert words.lower() in err["message"].lower(), err
    # nothing stored, nothing registered, nothing half-written in staging
    assert platform.ctx.store.stored_paths() == []
    staging = platform.ctx.store.staging_root
    assert not staging.exists() or list(staging.iterdir()) == []
    with platform.ctx.sessions() as s:
        assert s.scalar(select(func.count()).select_from(Adapter)) == 0
    assert client.get("/admin/v1/audit?action=adapter.create", headers=H).json()["data"] == []
    # the server keeps serving, and a good upload still works afterwards
    assert client.get("/health").json()["status"] == "ok"
    ok = upload(client, "victim", zip_bytes(good_files), tenant_id=acme)
    assert ok.status_code == 201, ok.text


def test_streamed_body_over_the_limit_gets_413(platform, client):
    """A chunked upload without Content-Length is cut off at the limit."""
    boundary = "lpxboundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\nbig\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.zip"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()

    def body():
        yield head
        for _ in range(6):
            yield b"\0" * MiB
        yield f"\r\n--{boundary}--\r\n".encode()

    r = client.post(
        "/admin/v1/adapters", content=body(), headers={**H, "content-type": f"multipart/form-data; boundary={boundary}"}
    )
    assert_error(r, 413, contains="larger than")
    assert platform.ctx.store.stored_paths() == []
    assert client.get("/health").status_code == 200
