"""``system_fingerprint`` (OpenAI's field on chat and completion bodies and chunks): which backend
configuration produced an answer, so a client that pins ``seed`` can tell when the same request may
now give other tokens. It hashes the loraplex version, the base model's name, the engine's resolved
configuration (dtype, kernels, speculation... everything that can change the tokens) and the adapter
version (its row id: a re-registered adapter is another version). Computed once per engine client."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import weakref
from typing import Any

_BASE: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _version() -> str:
    try:
        return importlib.metadata.version("loraplex")
    except importlib.metadata.PackageNotFoundError:
        return "dev"


def _base(engine: Any) -> str:
    known = _BASE.get(engine)
    if known is None:
        try:
            config = engine.resolved_config()
        except Exception:  # noqa: BLE001 - an engine that cannot say: the model name alone
            config = {}
        text = json.dumps([_version(), engine.model_name, config], sort_keys=True, default=str)
        known = hashlib.sha256(text.encode()).hexdigest()
        _BASE[engine] = known
    return known


def system_fingerprint(engine: Any, adapter_id: str | None) -> str:
    """``fp_`` and 10 hex digits, as OpenAI writes it."""
    return "fp_" + hashlib.sha256(f"{_base(engine)}:{adapter_id or ''}".encode()).hexdigest()[:10]
