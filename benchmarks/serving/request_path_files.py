"""How many platform files one chat completion goes through (a structural count, not a timing).

    .venv/bin/python -m benchmarks.serving.request_path_files            # this checkout
    PYTHONPATH=<tree>/build/typecheck .venv/bin/python -m benchmarks.serving.request_path_files   # another one

A real app (the tiny random demo model, SQLite, one tenant) answers one warm-up chat completion,
then one traced: every Python function called in any thread is recorded with the file it lives in.
"inbound" counts the platform files entered before the engine client's ``submit`` (the request
path of issue 34: HTTP guards -> auth -> admission -> sampling values -> engine), "all" the whole
request through rendering. Printed as a table (files in the order first entered) and written to
benchmarks/results/request_path_files.json. Takes ~20 s.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path

from benchmarks.lib.workload import write_json


def main() -> None:
    from fastapi.testclient import TestClient

    import loraplex.platform.app as app_module
    from loraplex.engine import ensure_demo_model
    from loraplex.platform.app import build_context, create_app
    from loraplex.platform.settings import load_settings

    platform_dir = str(Path(app_module.__file__).resolve().parent)
    tmp = Path(tempfile.mkdtemp(prefix="request-path-"))
    model = ensure_demo_model(tmp / "model")
    admin = "bench-admin-key-0123456789abcdef"
    settings = load_settings(
        data_dir=tmp / "data",
        database_url=f"sqlite:///{tmp / 'db.sqlite'}",
        admin_key=admin,
        engine={"model": str(model), "max_num_seqs": 4, "kv_cache_memory_gb": 0.05},
    )
    ctx, _ = build_context(settings)
    app = create_app(ctx)

    order: dict[str, int] = {}
    boundary: list[int] = []
    recording = threading.Event()

    def profile(frame, event, _arg):  # noqa: ANN001 - sys.setprofile's signature
        if event != "call" or not recording.is_set():
            return
        path = str(Path(frame.f_code.co_filename).resolve())
        if not path.startswith(platform_dir):
            return
        rel = "platform" + path[len(platform_dir) :]
        order.setdefault(rel, len(order))
        if frame.f_code.co_name == "submit" and "engine_client" in rel and not boundary:
            boundary.append(len(order))

    sys.setprofile(profile)
    threading.setprofile(profile)
    body = {"model": ctx.engine.model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with TestClient(app) as client:
        admin_h = {"authorization": f"Bearer {admin}"}
        tid = client.post("/admin/v1/tenants", json={"name": "bench"}, headers=admin_h).json()["id"]
        key = client.post(f"/admin/v1/tenants/{tid}/keys", json={}, headers=admin_h).json()["key"]
        auth = {"authorization": f"Bearer {key}"}
        assert client.post("/v1/chat/completions", json=body, headers=auth).status_code == 200  # warm-up
        recording.set()
        r = client.post("/v1/chat/completions", json=body, headers=auth)
        recording.clear()
        assert r.status_code == 200, r.text
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]

    files = sorted(order, key=order.__getitem__)
    inbound = files[: boundary[0]] if boundary else files
    print(f"{'#':>3}  {'file':<52} inbound")
    for i, f in enumerate(files, 1):
        print(f"{i:>3}  {f:<52} {'yes' if f in inbound else ''}")
    print(f"\nplatform files: inbound (to the engine's submit) {len(inbound)}, whole request {len(files)}")
    write_json("request_path_files", {"inbound": inbound, "all": files})


if __name__ == "__main__":
    main()
