"""The engine seam: the ``EngineClient`` Protocol and its in-process implementation (the Ray Serve
one lives in ``platform/cluster``, so this package never imports Ray)."""

from loraplex.platform.engine_client.local import LocalEngineClient, LocalStream
from loraplex.platform.engine_client.protocol import (
    AdapterFacts,
    AdapterInvalid,
    EngineClient,
    EngineStats,
    EngineStream,
)
from loraplex.platform.engine_client.shared import TINY_RANDOM_MODEL, demo_model_dir, resolve_model_dir

__all__ = [
    "TINY_RANDOM_MODEL",
    "AdapterFacts",
    "AdapterInvalid",
    "EngineClient",
    "EngineStats",
    "EngineStream",
    "LocalEngineClient",
    "LocalStream",
    "demo_model_dir",
    "resolve_model_dir",
]
