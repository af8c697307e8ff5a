"""``loraplex serve``'s process runtime, applied before anything heavy is imported.

The fast CPU runtime (tcmalloc + Intel OpenMP, ``loraplex/engine/runtime_env.py``) has to be in the
process from its start, so ``serve`` re-executes itself once under it. That must happen before the
CLI imports torch (seconds of start-up, wasted on a process about to be replaced), and importing
``loraplex.engine.runtime_env`` the normal way would run ``loraplex.engine``'s ``__init__``, which
imports torch: so the module is loaded from its file here and registered under its real name (one
module object either way; it is standard library only).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_NAME = "loraplex.engine.runtime_env"


def runtime_env() -> ModuleType:
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    engine = importlib.util.find_spec("loraplex.engine")  # locates the package without importing it
    assert engine is not None and engine.submodule_search_locations, "loraplex.engine is not installed"
    path = Path(list(engine.submodule_search_locations)[0]) / "runtime_env.py"
    spec = importlib.util.spec_from_file_location(_NAME, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    spec.loader.exec_module(module)
    return module


def reexec_for_serve(argv: list[str]) -> None:
    """Called at the top of the CLI module: ``loraplex serve ...`` restarts under the fast runtime
    (if it is off, missing, or already loaded, nothing happens and start-up goes on)."""
    # `loraplex serve` (console script) or `python -m loraplex.platform.cli serve`.
    if len(argv) > 1 and argv[1] == "serve" and Path(argv[0]).name in ("loraplex", "cli.py"):
        runtime_env().reexec("loraplex serve")
