"""loraplex.engine's public surface: what the platform may import (import-linter holds the platform
to it), every name resolving, and the lazy loading that keeps light imports light."""

from __future__ import annotations

import subprocess
import sys

import loraplex.engine as engine


def test_every_public_name_resolves_to_its_module_object():
    assert sorted(engine.__all__) == sorted(engine._EXPORTS)
    for name, module in engine._EXPORTS.items():
        value = getattr(engine, name)
        defining = sys.modules["loraplex.engine" + module]
        assert getattr(defining, name) is value, name
    assert set(engine.__all__) <= set(dir(engine))


def test_unknown_name_is_an_attribute_error():
    try:
        engine.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("an unknown name resolved")


def test_config_level_names_do_not_import_the_model_code():
    """A CLI command reading settings imports SamplingParams-level names only: no torch."""
    code = (
        "import sys\n"
        "from loraplex.engine import SamplingParams, EngineRequest, InvalidRequestError, FinishReason\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
