"""``loraplex demo adapters``: train the two demo adapters and register them for the demo tenant,
through the same upload service as the admin API (validated against the base model, stored by
content, audited)."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from loraplex.platform.adapters import repository as adapters_repo
from loraplex.platform.adapters import service as adapters
from loraplex.platform.db.session import unit_of_work
from loraplex.platform.demo.bootstrap import DEMO_ACTOR, DEMO_TENANT
from loraplex.platform.demo.dataset import ADAPTERS
from loraplex.platform.demo.train import RECIPES, train_adapter
from loraplex.platform.tenants import repository as tenants_repo

Progress = Callable[[str], None]


def zip_folder(folder: Path) -> io.BytesIO:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(folder.iterdir()):
            if path.is_file():
                zf.write(path, path.name)
    buf.seek(0)
    return buf


def train_demo_adapters(
    model_dir: Path, out_root: Path, progress: Progress, names: list[str] | None = None, steps: int | None = None
) -> dict[str, Path]:
    """Train each demo adapter (its own recipe; ``steps`` overrides) into ``out_root/<name>``;
    returns name -> PEFT folder."""
    folders = {}
    for name in names or list(ADAPTERS):
        recipe = RECIPES[name] if steps is None else replace(RECIPES[name], steps=steps)
        progress(f"[loraplex] training demo adapter {name!r} ({ADAPTERS[name][1]}, {recipe.steps} steps) ...")
        folders[name] = train_adapter(model_dir, name, out_root / name, recipe, progress)
    return folders


def register_for_demo_tenant(ctx, folders: dict[str, Path]) -> list[dict]:
    """Upload each folder as a private adapter of the demo tenant (a new version if the name
    exists). The tenant must exist (``serve`` creates it in demo mode)."""
    registered = []
    with unit_of_work(ctx.sessions) as session:
        tenant = tenants_repo.get_by_name(session, DEMO_TENANT)
        if tenant is None:
            raise LookupError(f"no tenant named {DEMO_TENANT!r}: start `loraplex serve` once in demo mode first")
        for name, folder in folders.items():
            exists = adapters_repo.active_by_name(session, name) is not None
            req = adapters.UploadRequest(name, "private", tenant.id, new_version=exists)
            adapter = adapters.upload_adapter(session, ctx, DEMO_ACTOR, req, zip_folder(folder))
            registered.append(
                {
                    "name": adapter.name,
                    "id": adapter.id,
                    "version": adapter.version,
                    "rank": adapter.rank,
                    "tenant": DEMO_TENANT,
                }
            )
    return registered
