"""ASGI guard: a JSON request body with a lone UTF-16 surrogate anywhere in it (a string value or a
key: ``user``, a tool call's arguments, a tenant's name...), or a NUL character in a top-level
``user``/``model``/``name`` (stored or looked up in SQL as is), is refused with 400 before any
route runs, so nothing is reserved, tokenized or written. Such a string cannot be encoded as UTF-8, and
would otherwise fail deep inside the tokenizer or the usage ledger's commit.

A surrogate reaches Python's ``json`` either as a ``\\uD800``-style escape or as its raw CESU-8
bytes (``json.loads`` decodes bytes with ``surrogatepass``); a UTF-8 body with neither pattern is
passed on after one regex scan, without parsing it. A UTF-16 or UTF-32 body (``json.loads`` reads
those too) is parsed and checked whole, and so is any body whose content type names JSON in any
spelling (a hostile run got a lone surrogate past the guard, served and unbillable, with
``APPLICATION/JSON``, a UTF-16 body, or a second content-type header)."""

from __future__ import annotations

import json
import re
from typing import Any

from loraplex.platform.http.error_handlers import error_response

_CANDIDATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}|\xed[\xa0-\xbf]|\\u0000")
# Top-level fields that are stored or looked up in SQL as they are: PostgreSQL text cannot hold NUL.
_NO_NUL = ("user", "model", "name")
_METHODS = {"POST", "PUT", "PATCH"}


def bad_text_at(value: Any) -> tuple[str, str] | None:
    """Where the parsed body holds text that cannot be stored, and what is wrong with it: a lone
    surrogate anywhere, or a NUL in a top-level field that reaches the database (a NUL elsewhere,
    in a prompt or a message, is text like any other: it is tokenized, never stored)."""
    if isinstance(value, dict):
        for field in _NO_NUL:
            v = value.get(field)
            if isinstance(v, str) and "\x00" in v:
                return field, "a NUL character, which this field cannot hold"
    if _all_encodable(value):  # the common case, in C: escaped emoji pairs, a NUL in a prompt
        return None
    where = lone_surrogate_at(value)
    return None if where is None else (where, "a lone UTF-16 surrogate")


def _all_encodable(value: Any) -> bool:
    """Whether every string in the parsed body is valid Unicode, checked by the C JSON encoder and
    codec (a body of 350k strings costs ~50 ms this way; the walk that names the path is only run
    once a bad string is known to be there)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, ValueError, TypeError, RecursionError):
        return False
    return True


def lone_surrogate_at(value: Any, path: str = "") -> str | None:
    """The JSON path of the first string (value or key) that is not valid Unicode, else None."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, str):
            if not _encodable(v):
                return p or "body"
        elif isinstance(v, dict):
            for k, item in v.items():
                if not _encodable(k):
                    return p or "body"
                stack.append((item, f"{p}.{k}" if p else k))
        elif isinstance(v, list):
            stack.extend((item, f"{p}[{i}]") for i, item in enumerate(v))
    return None


def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def body_bad_text(body: bytes) -> tuple[str, str] | None:
    # json.loads (what the routes parse with) also reads UTF-16 and UTF-32 bodies, where the
    # patterns below cannot be seen in the bytes: those are parsed and checked whole.
    if json.detect_encoding(body) in ("utf-8", "utf-8-sig") and not _CANDIDATE.search(body):
        return None
    try:
        parsed = json.loads(body)
    except ValueError:  # not JSON: the route's own validation answers
        return None
    return bad_text_at(parsed)


def _may_be_json(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the routes could parse the body as JSON: no content type at all (FastAPI then parses
    JSON), or any content-type header naming JSON in any letter case (FastAPI reads the media type
    case-insensitively, from the first of several headers). Only then is the body buffered and
    scanned: an adapter upload (multipart) streams past untouched."""
    types = [value.lower() for name, value in headers if name == b"content-type"]
    return not types or any(b"json" in t for t in types)


class LoneSurrogateGuard:
    def __init__(self, app, prefixes: tuple[str, ...]) -> None:
        self.app = app
        self.prefixes = prefixes

    async def __call__(self, scope, receive, send):
        if (
            scope["type"] != "http"
            or scope["method"] not in _METHODS
            or not scope["path"].startswith(self.prefixes)
            or not _may_be_json(scope["headers"])
        ):
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left while sending
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        bad = body_bad_text(body)
        if bad is not None:
            where, why = bad
            response = error_response(
                400,
                f"{where} is not text that can be stored: it holds {why}",
                param=where,
                code="invalid_text",
            )
            return await response(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
