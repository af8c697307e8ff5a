"""Domain errors. Services raise these; ``http/error_handlers.py`` turns them into OpenAI-style bodies:
``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations


class PlatformError(Exception):
    status_code = 400
    type = "invalid_request_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}


class BadRequest(PlatformError):
    status_code = 400


class Unauthorized(PlatformError):
    status_code = 401
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(PlatformError):
    status_code = 403
    type = "permission_error"
    code = "forbidden"


class NotFound(PlatformError):
    status_code = 404
    type = "not_found_error"
    code = "not_found"


class Conflict(PlatformError):
    status_code = 409
    type = "conflict_error"
    code = "conflict"


class PayloadTooLarge(PlatformError):
    status_code = 413
    code = "payload_too_large"


class Unprocessable(PlatformError):
    status_code = 422
    code = "invalid_value"


class RateLimited(PlatformError):
    status_code = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class ServiceUnavailable(PlatformError):
    status_code = 503
    type = "service_unavailable"
    code = "unavailable"
