"""Exit codes, the client's exception tree and the default reason of each HTTP code,
importable without HTTP or pydantic.

One table for every client of the wire: `cli.client` re-exports it, `nvcli --local`
raises through it as a call to an agent does. nvcli imports this module at start so
that `--help` and `version` pay for neither (`hotmount.wire.schemas` loads on first use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hotmount.wire.schemas import Status

DEFAULT_TIMEOUT = 120.0

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_CONFLICT = 0, 1, 2, 3
EXIT_NOT_FOUND, EXIT_AUTH, EXIT_TIMEOUT, EXIT_QUOTA = 4, 5, 6, 7


class HotmountClientError(Exception):
    """Base of every error the client raises; `status` is the agent's `Status` body."""

    exit_code = EXIT_ERROR

    def __init__(self, status: Status) -> None:
        super().__init__(status.message)
        self.status = status

    @property
    def reason(self) -> str:
        return self.status.reason

    @property
    def code(self) -> int:
        return self.status.code

    @property
    def message(self) -> str:
        return self.status.message

    @property
    def details(self) -> dict[str, Any]:
        return self.status.details or {}


class InvalidRequest(HotmountClientError):
    exit_code = EXIT_USAGE


class Conflict(HotmountClientError):
    exit_code = EXIT_CONFLICT


class Busy(Conflict):
    """A process in the container holds the device open; `holders` names them."""

    @property
    def holders(self) -> list[dict[str, Any]]:
        return list(self.details.get("holders") or [])


class NotFound(HotmountClientError):
    exit_code = EXIT_NOT_FOUND


class Unauthorized(HotmountClientError):
    exit_code = EXIT_AUTH


class Forbidden(HotmountClientError):
    exit_code = EXIT_AUTH


class Timeout(HotmountClientError):
    exit_code = EXIT_TIMEOUT


class QuotaExceeded(HotmountClientError):
    """The namespace's ResourceQuota has no room for the GPU: not a permission problem."""

    exit_code = EXIT_QUOTA


class Unavailable(HotmountClientError):
    exit_code = EXIT_ERROR


_BY_REASON: dict[str, type[HotmountClientError]] = {
    "DeviceBusy": Busy,
    "QuotaExceeded": QuotaExceeded,
}
_BY_CODE: dict[int, type[HotmountClientError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: InvalidRequest,
    502: Unavailable,
    503: Unavailable,
    504: Timeout,
}
DEFAULT_REASON = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    502: "BadGateway",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def error_for(status: Status) -> HotmountClientError:
    """The exception for a `Status`: by reason first, then by HTTP code."""
    cls = _BY_REASON.get(status.reason) or _BY_CODE.get(status.code) or HotmountClientError
    return cls(status)


def make_status(code: int, message: str, reason: str | None = None, **details: Any) -> Status:
    from hotmount.wire.schemas import Status

    return Status(
        reason=reason or DEFAULT_REASON.get(code, "Unknown"),
        message=message,
        code=code,
        details=details or None,
    )
