"""The error responses the routes really return, documented in /openapi.json (every error body is
OpenAI-style: ``{"error": {"message", "type", "param", "code"}}``), so schema-driven clients and
the API fuzzing test (tests/platform/test_api_fuzz.py) know them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


_WHY = {
    400: "Invalid request (bad values, invalid text, too long for the context)",
    401: "Missing or invalid API key",
    403: "The key or tenant may not do this (suspended, not granted)",
    404: "No such resource (tenant, key, adapter, model)",
    408: "The request body did not arrive in time",
    409: "Conflicts with existing data, or the request was stopped by an operator",
    413: "The request body is too large",
    422: "A parameter fails validation",
    429: "Rate limit, concurrency or token budget exceeded (Retry-After, x-ratelimit-* headers)",
    503: "Engine or database unavailable, or the server is still starting (Retry-After)",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": ErrorBody, "description": _WHY[s]} for s in statuses}


ADMIN_ERRORS = error_responses(400, 401, 403, 404, 408, 409, 413, 422, 503)
TENANT_ERRORS = error_responses(400, 401, 403, 404, 408, 409, 413, 422, 429, 503)
