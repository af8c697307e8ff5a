"""Errors the engine raises to its callers. The platform maps them to HTTP 4xx bodies."""


class EngineError(Exception):
    """Base class for every error the engine reports on purpose."""


class InvalidRequestError(EngineError, ValueError):
    """The request can never be served as given (bad sampling values, empty prompt, too long...).

    ``param`` names the offending field when there is one, so an API can point at it.
    """

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class UnknownAdapterError(InvalidRequestError):
    """The request names an adapter the engine does not know."""


class EngineConfigError(EngineError, ValueError):
    """The engine cannot start with this configuration (e.g. an environment override that names an
    unknown CPU kind or linear); the message says which setting and what it may be."""


class EngineDeadError(EngineError):
    """The engine loop stopped and can take no more requests."""


class BusyError(EngineError):
    """The request is fine but cannot be taken now: work it needs is bounded per tenant and that
    tenant's share is in use (its grammar compilations). A retry after ``retry_after_s`` may pass."""

    def __init__(self, message: str, param: str | None = None, retry_after_s: float = 1.0):
        super().__init__(message)
        self.param = param
        self.retry_after_s = retry_after_s
