"""Plain-dict snapshot of a model row, for audit before/after (JSON-safe)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import inspect


def snapshot(obj: Any, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for attr in inspect(obj).mapper.column_attrs:
        if attr.key in exclude:
            continue
        value = getattr(obj, attr.key)
        out[attr.key] = value.isoformat() if isinstance(value, datetime) else value
    return out
