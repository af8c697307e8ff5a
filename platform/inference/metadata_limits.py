"""OpenAI's limits on ``metadata`` (chat completions and responses alike): at most 16 pairs, keys of
at most 64 characters, values strings of at most 512 characters. A stored response keeps its
metadata, so without them one request could store megabytes; over a limit is a 400 naming
``metadata``, before any work. Characters are Unicode code points (a 512-character value of
4-byte characters is 2 KiB stored)."""

from __future__ import annotations

from typing import Any

from loraplex.platform.errors import BadRequest

MAX_KEYS = 16
MAX_KEY_CHARS = 64
MAX_VALUE_CHARS = 512


def check_metadata(value: Any, param: str = "metadata") -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise BadRequest("metadata must be an object of string values", param=param, code="invalid_type")
    if len(value) > MAX_KEYS:
        raise BadRequest(
            f"metadata has {len(value)} keys; at most {MAX_KEYS} are allowed",
            param=param,
            code="object_above_max_properties",
        )
    for key, item in value.items():
        if len(key) > MAX_KEY_CHARS:  # the key itself is not echoed: it may be megabytes
            raise BadRequest(
                f"a metadata key has {len(key)} characters; at most {MAX_KEY_CHARS} are allowed",
                param=param,
                code="string_above_max_length",
            )
        if not isinstance(item, str):
            raise BadRequest(f"metadata value of {key!r} must be a string", param=param, code="invalid_type")
        if len(item) > MAX_VALUE_CHARS:
            raise BadRequest(
                f"metadata value of {key!r} has {len(item)} characters; at most {MAX_VALUE_CHARS} are allowed",
                param=param,
                code="string_above_max_length",
            )
