"""Every error leaves the server as an OpenAI-style body; bad input never becomes a 500."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DataError, IntegrityError, SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from loraplex.platform.errors import PlatformError
from loraplex.platform.http import request_id

log = logging.getLogger("loraplex.platform")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, *, param=None, code=None, headers=None) -> JSONResponse:
    type_ = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


async def _platform_error(_req: Request, exc: PlatformError) -> JSONResponse:
    if exc.status_code == 429:
        observer = getattr(getattr(_req.state, "ctx", None), "observer", None)
        if observer is not None:
            # the tenant the key belonged to (deps.require_tenant), for refusals by tenant
            observer.rate_limited(exc.message, exc.code, getattr(_req.state, "tenant_id", None))
    body = error_body(exc.message, exc.type, exc.param, exc.code)
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers or None)


async def _validation_error(_req: Request, exc: RequestValidationError) -> JSONResponse:
    # The tenant API follows OpenAI's contract (a bad value is a 400, which the SDKs raise as
    # BadRequestError); the admin API keeps FastAPI's 422 for a well-formed body with bad values.
    status = 422 if _req.url.path.startswith("/admin") else 400
    errors = list(exc.errors())
    first: dict[str, Any] = errors[0] if errors else {"msg": "invalid request", "loc": ()}
    if first.get("type") == "json_invalid":
        return error_response(400, "request body is not valid JSON", code="invalid_json")
    if tuple(first.get("loc", ())) == ("body",):
        if first.get("type") == "missing":
            return error_response(400, "a JSON request body is required", code="invalid_body")
        if first.get("type") in ("model_attributes_type", "dict_type", "model_type"):
            return error_response(400, "request body must be a JSON object", code="invalid_body")
    # pydantic reports a value that fits no member of a union once per member: one problem, named
    # where it went deepest (``messages[0].content[0].text`` rather than ``messages[0].content``)
    top = openai_param(first.get("loc", ()))
    related = [e for e in errors if top and _within(openai_param(e.get("loc", ())), top)] or [first]
    chosen = max(related, key=lambda e: len(e.get("loc", ())))
    param = openai_param(chosen.get("loc", ()))
    same = [e for e in related if openai_param(e.get("loc", ())) == param]
    message, code = openai_error(same[0], same)
    others = len(errors) - len(related)
    if others > 0:
        message += f" (and {others} more problem(s))"
    return error_response(status, message, param=param, code=code)


def _within(param: str | None, top: str) -> bool:
    return param is not None and (param == top or param.startswith((top + ".", top + "[")))


_LOCATIONS = ("body", "query", "path", "form", "header")
_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none", "bytes"}


def openai_param(loc: tuple | list) -> str | None:
    """OpenAI's spelling of where a value is: ``messages[0].content``. pydantic's location also
    names the union member it tried (``str``, ``list[TextPart]``, ``ChatMessage``...): left out."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        p = str(part)
        if p in _LOCATIONS and not out:
            continue
        if p in _TYPE_NAMES or not p.isidentifier() or p[:1].isupper():
            continue  # a union member's tag, not a field
        out += f".{p}" if out else p
    return out or None


# pydantic error type -> what OpenAI says it expected
_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "string_type": "a string",
    "bool_type": "a boolean",
    "bool_parsing": "a boolean",
    "list_type": "an array",
    "tuple_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "none_required": "null",
}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "a value of another type"


def _bound(ctx: dict[str, Any]) -> tuple[str, Any]:
    for key, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        if key in ctx:
            return sign, ctx[key]
    return "", ""


def openai_error(first: dict[str, Any], same: list[dict[str, Any]]) -> tuple[str, str]:
    """The message and code OpenAI gives for this kind of problem (docs/openai-api.md, "Error
    codes"): clients and frameworks branch on the code, people read the message."""
    kind = first.get("type", "")
    name = openai_param(first.get("loc", ())) or "body"
    value = first.get("input")
    ctx = first.get("ctx") or {}
    if kind == "missing":
        return f"Missing required parameter: '{name}'.", "missing_required_parameter"
    expected = [_EXPECTED[e.get("type", "")] for e in same if e.get("type", "") in _EXPECTED]
    if expected and len(expected) == len(same):
        wanted = " or ".join(dict.fromkeys(expected))
        return f"Invalid type for '{name}': expected {wanted}, but got {_kind(value)} instead.", "invalid_type"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        sign, limit = _bound(ctx)
        number = "decimal" if isinstance(limit, float) or isinstance(value, float) else "integer"
        side = "below_min" if kind.startswith("greater") else "above_max"
        words = "below minimum" if side == "below_min" else "above maximum"
        return (
            f"Invalid '{name}': {number} {words} value. Expected a value {sign} {limit}, but got {_short(value)} instead.",
            f"{number}_{side}_value",
        )
    if kind == "too_short" and isinstance(value, list):
        if not value:
            return (
                f"Invalid '{name}': empty array. Expected an array with minimum length "
                f"{ctx.get('min_length', 1)}, but got an empty array instead.",
                "empty_array",
            )
        return (
            f"Invalid '{name}': array too short. Expected an array with minimum length {ctx.get('min_length')}, "
            f"but got an array with length {len(value)} instead.",
            "array_below_min_length",
        )
    if kind == "too_long" and isinstance(value, list | dict):
        return (
            f"Invalid '{name}': array too long. Expected an array with maximum length {ctx.get('max_length')}, "
            f"but got an array with length {len(value)} instead.",
            "array_above_max_length",
        )
    if kind == "string_too_long" and isinstance(value, str):
        return (
            f"Invalid '{name}': string too long. Expected a string with maximum length {ctx.get('max_length')}, "
            f"but got a string with length {len(value)} instead.",
            "string_above_max_length",
        )
    if kind == "string_pattern_mismatch":
        return (
            f"Invalid '{name}': string does not match pattern. Expected a string that matches the pattern "
            f"'{ctx.get('pattern')}'.",
            "invalid_value",
        )
    if kind in ("literal_error", "enum"):
        return f"Invalid value for '{name}': {_short(value)}. {first.get('msg', '')}.", "invalid_value"
    return f"{name}: {first.get('msg', 'invalid value')}", "invalid_value"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


async def _http_error(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
    message = exc.detail if isinstance(exc.detail, str) else "request failed"
    if exc.status_code == 404 and message == "Not Found":
        message = "no such route"
    return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))


async def _integrity_error(_req: Request, exc: IntegrityError) -> JSONResponse:
    # Two requests raced for the same unique value; the service checks catch the common case.
    return error_response(409, "the change conflicts with existing data", code="conflict")


async def _data_error(_req: Request, exc: DataError) -> JSONResponse:
    # The database refused a value it cannot hold (a NUL in PostgreSQL text, a number out of range):
    # the client's input, never a server fault.
    log.info("database refused a value: %s", str(exc.orig).splitlines()[0][:200] if exc.orig else exc)
    return error_response(400, "a value in the request cannot be stored or searched for", code="invalid_value")


DB_RETRY_AFTER_S = 5


async def _database_error(_req: Request, exc: SQLAlchemyError) -> JSONResponse:
    from loraplex.platform.db.session import is_unreachable

    if is_unreachable(exc):  # an outage, not a bug: tell clients when to come back
        log.warning("database unavailable: %s", str(exc).splitlines()[0][:200])
        return JSONResponse(
            error_body(
                "the database is unavailable; retry shortly", "service_unavailable", None, "database_unavailable"
            ),
            status_code=503,
            headers={"retry-after": str(DB_RETRY_AFTER_S)},
        )
    return await _unexpected(_req, exc)


async def _unexpected(_req: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    # Starlette answers this from its error middleware, outside every guard: RequestId never sees
    # this answer, so the id it chose is set here
    rid = request_id.of(_req.scope)
    return error_response(
        500, "internal server error", code="internal_error", headers={"x-request-id": rid} if rid else None
    )


_E = TypeVar("_E", bound=Exception)


def _on(app: FastAPI, exc_type: type[_E], handler: Callable[[Request, _E], Awaitable[Response]]) -> None:
    # Starlette calls a handler only with instances of the class it is registered for, but types
    # every handler as taking any Exception; the cast records that pairing in one place.
    app.add_exception_handler(exc_type, cast(Callable[[Request, Exception], Awaitable[Response]], handler))


def install_error_handlers(app: FastAPI) -> None:
    _on(app, PlatformError, _platform_error)
    _on(app, RequestValidationError, _validation_error)
    _on(app, StarletteHTTPException, _http_error)
    _on(app, IntegrityError, _integrity_error)
    _on(app, DataError, _data_error)
    _on(app, SQLAlchemyError, _database_error)
    _on(app, Exception, _unexpected)
