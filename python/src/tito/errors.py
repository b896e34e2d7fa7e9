"""Typed exceptions. An HTTP error from the gateway raises an `APIError`
subclass chosen by its status (and, for a few, its `code`), carrying the
error body tito sent: OpenAI's `{"error": {"message", "type", "param",
"code"}}` or, on the Messages routes, Anthropic's `{"type": "error",
"error": {"type", "message"}}`."""

from __future__ import annotations

import json
from typing import Any

import httpx


class TitoError(Exception):
    """Base class of every exception this package raises."""


class TitoConnectionError(TitoError):
    """The gateway could not be reached, or the connection broke."""


class IncompatibleGatewayError(TitoError):
    """The gateway's export schema is not one this package knows."""

    def __init__(self, message: str, *, gateway_version: str | None,
                 schema_version: str | None) -> None:
        super().__init__(message)
        self.gateway_version = gateway_version
        self.schema_version = schema_version


class NoSampleError(TitoError):
    """A trajectory has no sample to train on (its agent made no call)."""


class APIError(TitoError):
    """The gateway answered with an error status.

    `status` is the HTTP status; `body` the parsed JSON body (or the text
    when it was not JSON); `message`, `type`, `param` and `code` are read
    from it where present (None otherwise)."""

    def __init__(self, response: httpx.Response) -> None:
        self.status: int = response.status_code
        self.method: str = response.request.method
        self.url: str = str(response.request.url)
        self.headers: httpx.Headers = response.headers
        text = response.text
        try:
            body: Any = json.loads(text) if text else None
        except ValueError:
            body = text
        self.body: Any = body
        err = body.get("error") if isinstance(body, dict) else None
        err = err if isinstance(err, dict) else {}
        self.message: str | None = err.get("message")
        self.type: str | None = err.get("type")
        self.param: str | None = err.get("param")
        self.code: str | None = err.get("code")
        detail = self.message if self.message is not None else (text[:500] or "(empty body)")
        super().__init__(f"{self.method} {self.url}: {self.status}: {detail}")


class BadRequestError(APIError):
    """400: the request was refused (`param` names the field)."""


class AuthenticationError(APIError):
    """401: a missing or wrong token for the route's role."""


class PermissionDeniedError(APIError):
    """403."""


class NotFoundError(APIError):
    """404: unknown trajectory, group, model or route."""


class ConflictError(APIError):
    """409: e.g. a call on a finished trajectory, another group for a
    trajectory, an admin operation already running, a commit without a
    begin."""


class CursorExpiredError(ConflictError):
    """409 `cursor_expired`: the page's lease ended and some of its
    trajectories were leased again before the acknowledgement."""


class PayloadTooLargeError(APIError):
    """413."""


class UnprocessableEntityError(APIError):
    """422."""


class RateLimitError(APIError):
    """429: `[server] max_concurrent_requests` reached."""


class ServerError(APIError):
    """5xx."""


class BadGatewayError(ServerError):
    """502: a backend failed (a weight update's body lists each backend's
    outcome)."""


class ServiceUnavailableError(ServerError):
    """503: no healthy backend, or a queue full."""


class GatewayTimeoutError(ServerError):
    """504: a backend timed out."""


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: UnprocessableEntityError,
    429: RateLimitError,
    502: BadGatewayError,
    503: ServiceUnavailableError,
    504: GatewayTimeoutError,
}


def error_for(response: httpx.Response) -> APIError:
    """The exception for an error response."""
    cls = _BY_STATUS.get(response.status_code)
    if cls is None:
        cls = ServerError if response.status_code >= 500 else APIError
    err = cls(response)
    if isinstance(err, ConflictError) and err.code == "cursor_expired":
        err = CursorExpiredError(response)
    return err


def raise_for_status(response: httpx.Response) -> httpx.Response:
    """`response` when its status is below 400, else its typed exception."""
    if response.status_code >= 400:
        raise error_for(response)
    return response
