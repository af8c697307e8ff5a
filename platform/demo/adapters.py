"""``loraplex demo adapters``: train the demo adapters and register each for the demo tenant as
soon as it is trained, through the same upload service as the admin API (validated against the
base model, stored by content, audited).

A run is resumable: each adapter's folder gets a done marker (``loraplex-demo.json``) keyed by
``recipe_key`` (base model, recipe, data, template, trainer source) once its weights are saved,
and the id it was registered under once it is registered. A rerun skips an adapter whose marker
has the current key (and registers it only if that registration is gone), retrains one whose
recipe or data changed, and resumes one that was killed mid-training from its checkpoint."""

from __future__ import annotations

import io
import json
import time
import zipfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from loraplex.platform.adapters import repository as adapters_repo
from loraplex.platform.adapters import service as adapters
from loraplex.platform.db.session import unit_of_work
from loraplex.platform.demo.bootstrap import DEMO_ACTOR, DEMO_TENANT
from loraplex.platform.demo.dataset import ADAPTERS
from loraplex.platform.demo.train import RECIPES, recipe_key, train_adapter
from loraplex.platform.tenants import repository as tenants_repo

Progress = Callable[[str], None]
# Called with (name, folder) once an adapter's weights are saved (or found up to date).
OnTrained = Callable[[str, Path], None]
MARKER = "loraplex-demo.json"


def zip_folder(folder: Path) -> io.BytesIO:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(folder.iterdir()):
            if path.is_file() and path.name in ("adapter_config.json", "adapter_model.safetensors"):
                zf.write(path, path.name)
    buf.seek(0)
    return buf


def read_marker(folder: Path) -> dict:
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}


def write_marker(folder: Path, marker: dict) -> None:
    tmp = folder / (MARKER + ".tmp")
    tmp.write_text(json.dumps(marker, indent=2))
    tmp.replace(folder / MARKER)  # never a half-written marker


def is_trained(folder: Path, key: str) -> bool:
    return read_marker(folder).get("key") == key and (folder / "adapter_model.safetensors").is_file()


def train_demo_adapters(
    model_dir: Path,
    out_root: Path,
    progress: Progress,
    names: list[str] | None = None,
    steps: int | None = None,
    on_trained: OnTrained | None = None,
) -> dict[str, Path]:
    """Train each demo adapter (its own recipe; ``steps`` overrides) into ``out_root/<name>``,
    skipping one already trained with the same key; ``on_trained`` runs after each, before the
    next one starts. Returns name -> PEFT folder."""
    folders = {}
    chosen = names or list(ADAPTERS)
    for n, name in enumerate(chosen, 1):
        recipe = RECIPES[name] if steps is None else replace(RECIPES[name], steps=steps)
        key = recipe_key(model_dir, name, recipe)
        folder = out_root / name
        if is_trained(folder, key):
            progress(f"[loraplex] demo adapter {name!r} ({n}/{len(chosen)}) is up to date in {folder}: not retrained")
        else:
            progress(
                f"[loraplex] training demo adapter {name!r} ({n}/{len(chosen)}: {ADAPTERS[name][1]}, "
                f"{recipe.steps} steps) ..."
            )
            start = time.monotonic()
            (folder / MARKER).unlink(missing_ok=True)
            train_adapter(model_dir, name, folder, recipe, progress, key=key)
            write_marker(folder, {"key": key, "recipe": name, "trained_s": round(time.monotonic() - start, 1)})
            progress(f"[loraplex] demo adapter {name!r} trained in {time.monotonic() - start:.0f} s")
        folders[name] = folder
        if on_trained is not None:
            on_trained(name, folder)
    return folders


def register_for_demo_tenant(ctx, folders: dict[str, Path], skip_registered: bool = False) -> list[dict]:
    """Upload each folder as a private adapter of the demo tenant (a new version if the name
    exists). The tenant must exist (``serve`` creates it in demo mode). With ``skip_registered``,
    a folder whose marker names the adapter that is still the active one under its name is left
    as it is (a resumed run does not add versions of what it registered before it was stopped)."""
    registered, markers = [], []
    with unit_of_work(ctx.sessions) as session:
        tenant = tenants_repo.get_by_name(session, DEMO_TENANT)
        if tenant is None:
            raise LookupError(f"no tenant named {DEMO_TENANT!r}: start `loraplex serve` once in demo mode first")
        for name, folder in folders.items():
            active = adapters_repo.active_by_name(session, name)
            marker = read_marker(folder)
            if skip_registered and active is not None and marker.get("registered_id") == active.id:
                registered.append(_row(active, skipped=True))
                continue
            req = adapters.UploadRequest(name, "private", tenant.id, new_version=active is not None)
            adapter = adapters.upload_adapter(session, ctx, DEMO_ACTOR, req, zip_folder(folder))
            session.flush()
            registered.append(_row(adapter))
            if marker:
                markers.append((folder, {**marker, "registered_id": adapter.id}))
    for folder, marker in markers:  # after the commit: a marker never names an uncommitted adapter
        write_marker(folder, marker)
    return registered


def _row(adapter, skipped: bool = False) -> dict:
    row = {
        "name": adapter.name,
        "id": adapter.id,
        "version": adapter.version,
        "rank": adapter.rank,
        "tenant": DEMO_TENANT,
    }
    return {**row, "already_registered": True} if skipped else row
