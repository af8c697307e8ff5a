"""Access logs never carry secrets: query strings are replaced by their parameter names (keys are
only accepted in the Authorization header, but a client may still put one in a URL). Each line
names the request's ``x-request-id`` (``request_id.py``): ``request_id=...`` at the end of a text
line, a ``request_id`` field in JSON logs."""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl

from loraplex.platform.http import request_id


def redact_query(path: str) -> str:
    base, sep, query = path.partition("?")
    if not sep:
        return path
    names = [name for name, _ in parse_qsl(query, keep_blank_values=True)]
    return base + "?" + "&".join(f"{n}=[redacted]" for n in names) if names else base + "?[redacted]"


class RedactQueryStrings(logging.Filter):
    """For uvicorn's access logger: its records carry (client, method, path, http version, status).
    The request id rides along as ``record.request_id`` and, for the JSON formatter, in
    ``record.request``."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        rid = request_id.current.get() or "-"
        record.request_id = rid
        if not isinstance(getattr(record, "request", None), dict):
            record.request = {"request_id": rid}
        return True


def install() -> None:
    """The filter on uvicorn's access logger, and ``request_id=`` on its text lines (uvicorn's own
    formatter builds the line from the record's five arguments, so the id goes in its format)."""
    logger = logging.getLogger("uvicorn.access")
    logger.addFilter(RedactQueryStrings())
    for handler in logger.handlers:
        formatter = handler.formatter
        fmt = getattr(getattr(formatter, "_style", None), "_fmt", None)
        if formatter is not None and fmt and "request_id" not in fmt:
            handler.setFormatter(type(formatter)(fmt=fmt + " request_id=%(request_id)s"))
