"""Access logs never carry secrets: query strings are replaced by their parameter names (keys are
only accepted in the Authorization header, but a client may still put one in a URL)."""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl


def redact_query(path: str) -> str:
    base, sep, query = path.partition("?")
    if not sep:
        return path
    names = [name for name, _ in parse_qsl(query, keep_blank_values=True)]
    return base + "?" + "&".join(f"{n}=[redacted]" for n in names) if names else base + "?[redacted]"


class RedactQueryStrings(logging.Filter):
    """For uvicorn's access logger: its records carry (client, method, path, http version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        return True


def install() -> None:
    logging.getLogger("uvicorn.access").addFilter(RedactQueryStrings())
