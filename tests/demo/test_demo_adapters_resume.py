"""`loraplex demo adapters` registers each adapter as soon as it is trained and resumes after an
interruption: a run SIGKILLed after its first registration keeps that adapter (the rerun neither
retrains nor re-registers it), a changed recipe retrains, and a run stopped mid-training resumes
from its checkpoint to the very weights an uninterrupted run gets. On the tiny random model (the
data and recipes are the real ones, with few steps), so it costs seconds, not minutes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from loraplex.engine.demo_model import ensure_demo_model
from loraplex.platform.adapters import repository as adapters_repo
from loraplex.platform.context import PlatformContext
from loraplex.platform.demo.adapters import MARKER, read_marker, train_demo_adapters
from loraplex.platform.demo.train import CHECKPOINT, RECIPES, recipe_key, train_adapter
from loraplex.platform.engine_client import LocalEngineClient
from loraplex.platform.settings import load_settings

pytestmark = pytest.mark.slow  # starts `loraplex demo adapters` processes


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return Path(ensure_demo_model(tmp_path_factory.mktemp("models") / "tiny"))


def _cli(data_dir: Path, model: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "LORAPLEX_ENGINE__MODEL": str(model)}
    args = [sys.executable, "-m", "loraplex.platform.cli", "demo", "adapters", "--data-dir", str(data_dir), *extra]
    return subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def _versions(data_dir: Path, model: Path) -> dict[str, list[tuple[int, str]]]:
    settings = load_settings(data_dir=data_dir, engine={"model": str(model)})
    ctx = PlatformContext.build(settings, LocalEngineClient.disabled())
    try:
        with ctx.sessions() as session:
            out: dict[str, list[tuple[int, str]]] = {}
            for name in ("french", "pirate", "tools"):
                out[name] = sorted((a.version, a.status) for a in adapters_repo.versions(session, name))
            return out
    finally:
        ctx.close()


@pytest.mark.timeout(600)
def test_a_killed_run_keeps_its_registered_adapter_and_the_rerun_skips_it(tmp_path, tiny_model):
    data = tmp_path / "data"
    proc = _cli(data, tiny_model, "--steps", "3")
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if "demo adapter 'french' registered" in line:
            os.killpg(proc.pid, signal.SIGKILL)  # no clean-up of any kind runs
            break
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "".join(seen)
    assert any("step 3/3" in line and "ETA" in line for line in seen)  # progress: step n/N, loss, ETA
    assert read_marker(data / "demo-adapters" / "french").get("registered_id")

    rerun = _cli(data, tiny_model, "--steps", "3")
    out, _ = rerun.communicate(timeout=500)
    assert rerun.returncode == 0, out
    assert "demo adapter 'french' (1/3) is up to date" in out and "training demo adapter 'french'" not in out
    assert "demo adapter 'french' already registered" in out
    assert "demo adapter 'tools' registered" in out
    versions = _versions(data, tiny_model)
    assert versions["french"] == [(1, "active")]  # not a second version of what the killed run registered
    assert versions["pirate"] and versions["tools"] and all(v[-1][1] == "active" for v in versions.values())

    # Another recipe (here: step count) is another key: that adapter alone retrains.
    again = _cli(data, tiny_model, "--steps", "4", "--only", "pirate")
    out, _ = again.communicate(timeout=500)
    assert again.returncode == 0, out
    assert "training demo adapter 'pirate'" in out and "french" not in out
    assert "demo adapter 'pirate' registered" in out


class _Stop(Exception):
    pass


def test_a_run_stopped_mid_training_resumes_to_the_same_weights(tmp_path, tiny_model):
    recipe = replace(RECIPES["pirate"], steps=8)
    key = recipe_key(tiny_model, "pirate", recipe)

    def stop_at_step_7(line: str) -> None:
        if "step 7/8" in line:
            raise _Stop

    with pytest.raises(_Stop):
        train_adapter(tiny_model, "pirate", tmp_path / "cut", recipe, stop_at_step_7, key=key, checkpoint_every=5)
    assert (tmp_path / "cut" / CHECKPOINT).is_file()
    lines: list[str] = []
    train_adapter(tiny_model, "pirate", tmp_path / "cut", recipe, lines.append, key=key, checkpoint_every=5)
    assert any("resuming at step 6/8" in line for line in lines)
    assert not any("step 5/8" in line for line in lines)  # steps 1-5 came from the checkpoint
    assert not (tmp_path / "cut" / CHECKPOINT).exists()
    train_adapter(tiny_model, "pirate", tmp_path / "whole", recipe, lambda _: None, key=key, checkpoint_every=5)
    cut = load_file(str(tmp_path / "cut" / "adapter_model.safetensors"))
    whole = load_file(str(tmp_path / "whole" / "adapter_model.safetensors"))
    assert cut.keys() == whole.keys()
    for name in whole:
        torch.testing.assert_close(cut[name], whole[name], rtol=1e-5, atol=1e-6)


def test_a_checkpoint_of_another_recipe_is_not_resumed(tmp_path, tiny_model):
    recipe = replace(RECIPES["pirate"], steps=6)

    def stop(line: str) -> None:
        if "step 6/6" in line:
            raise _Stop

    with pytest.raises(_Stop):
        train_adapter(tiny_model, "pirate", tmp_path / "a", recipe, stop, key="one", checkpoint_every=5)
    lines: list[str] = []
    train_adapter(tiny_model, "pirate", tmp_path / "a", recipe, lines.append, key="two", checkpoint_every=5)
    assert not any("resuming" in line for line in lines) and any("step 1/6" in line for line in lines)


def test_markers_skip_only_what_is_up_to_date(tmp_path, tiny_model):
    lines: list[str] = []
    train_demo_adapters(tiny_model, tmp_path, lines.append, names=["pirate"], steps=2)
    assert (tmp_path / "pirate" / MARKER).is_file()
    lines.clear()
    trained: list[str] = []
    train_demo_adapters(
        tiny_model, tmp_path, lines.append, names=["pirate"], steps=2, on_trained=lambda n, _f: trained.append(n)
    )
    assert trained == ["pirate"] and any("up to date" in line for line in lines)
    assert not any("training demo adapter" in line for line in lines)
