"""The names callers used before the engine seam became a Protocol (``platform/engine_client``):
``EngineGateway`` is the in-process client, kept so ``app``/``cli`` and tests keep their imports."""

from loraplex.platform.engine_client import (
    TINY_RANDOM_MODEL,
    AdapterFacts,
    AdapterInvalid,
    EngineClient,
    LocalEngineClient,
    demo_model_dir,
    resolve_model_dir,
)

EngineGateway = LocalEngineClient

__all__ = [
    "TINY_RANDOM_MODEL",
    "AdapterFacts",
    "AdapterInvalid",
    "EngineClient",
    "EngineGateway",
    "demo_model_dir",
    "resolve_model_dir",
]
