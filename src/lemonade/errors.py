"""The error every layer raises for the client: the router, the downloads and the services raise
it without knowing about HTTP frameworks; `api/errors.py` renders it in each API family's shape."""

from __future__ import annotations

from typing import Any

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found",
    405: "invalid_request_error",
    409: "conflict",
    413: "invalid_request_error",
    429: "rate_limit_error",
    501: "not_implemented",
    502: "upstream_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error meant for the client: HTTP status, a message saying what to do, an optional code."""

    def __init__(self, status: int, message: str, *, type: str | None = None, code: str | None = None,
                 extra: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
                 plain: bool = False) -> None:
        super().__init__(message)
        self.plain = plain  # `{"error": "<message>"}` where the spec documents that shape (api/errors.py)
        self.headers = headers  # e.g. Retry-After on a 503
        self.status = status
        self.message = message
        self.type = type or _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.code = code
        self.extra = extra or {}


def bad_request(message: str, code: str | None = "invalid_argument") -> APIError:
    return APIError(400, message, code=code)


def registration_error(message: str) -> APIError:
    """A model definition refused by `/v1/pull`: api-lemonade.md documents its body as
    `{"error": "<message>"}` (a string), next to the `status`/`message` pair every error has."""
    return APIError(400, message, code="invalid_argument", plain=True)


def model_not_found(name: str) -> APIError:
    return APIError(404, f"Model {name} has not been found. Run `lemonade list` to see available models.",
                    type="not_found", code="model_not_found")
