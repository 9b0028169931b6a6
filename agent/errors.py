"""The agent's errors and their one mapping to a Kubernetes `Status`.

    ApiError                     (agent-level; engine errors are hotmount.errors.HotmountError)
    ├── BadRequest          400
    ├── Unauthorized        401  no or unverifiable credentials
    ├── Forbidden           403  SubjectAccessReview said no
    ├── PodNotFound         404
    ├── PodNotRunning       409
    ├── AllocatedToPod      409  the kubelet gave the device to another running pod
    ├── Unschedulable       409  the holder pod found no room
    ├── TooLarge            413  the request body is over the cap
    ├── UnsupportedMediaType 415 a PATCH that is not a JSON merge patch (server-side apply)
    ├── NotOnThisNode       421  the pod lives elsewhere (the gateway forwards it)
    ├── TooManyRequests     429  every slot for this kind of call is taken (Retry-After)
    ├── NotReady            503
    ├── UpstreamError       502  Kubernetes, the kubelet or another agent failed
    └── Timeout             504

`status_of()` turns any exception into (code, Status); a user's mistake is never a 500.
An engine error maps as in hotmount/wire/results.py, which `nvcli --local` shares.
"""

from __future__ import annotations

from typing import Any

from hotmount.api import HotmountError
from hotmount.wire.results import engine_status
from hotmount.wire.schemas import Status


class ApiError(Exception):
    code = 500
    reason = "InternalError"

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class BadRequest(ApiError):
    code, reason = 400, "BadRequest"


class Unauthorized(ApiError):
    code, reason = 401, "Unauthorized"


class Forbidden(ApiError):
    code, reason = 403, "Forbidden"


class PodNotFound(ApiError):
    code, reason = 404, "PodNotFound"


class PodNotRunning(ApiError):
    code, reason = 409, "PodNotRunning"


class AllocatedToPod(ApiError):
    code, reason = 409, "AllocatedToPod"


class Unschedulable(ApiError):
    code, reason = 409, "Unschedulable"


class PinRefused(ApiError):
    """A resume could not pin the GPU it was to mount (agent/suspend/suspending.py): nothing
    is mounted, no pin is left, the suspension is kept."""

    code, reason = 409, "PinRefused"


class QuotaExceeded(ApiError):
    """A ResourceQuota of the target's namespace has no room for the pin or holder pod
    that would charge it: refused as the API server refuses, and nothing is mounted."""

    code, reason = 403, "QuotaExceeded"


class TooLarge(ApiError):
    code, reason = 413, "RequestEntityTooLarge"


class UnsupportedMediaType(ApiError):
    code, reason = 415, "UnsupportedMediaType"


class TooManyRequests(ApiError):
    code, reason = 429, "TooManyRequests"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message, {"retryAfterSeconds": retry_after})
        self.retry_after = retry_after


class NotOnThisNode(ApiError):
    code, reason = 421, "NotOnThisNode"

    def __init__(self, message: str, node: str) -> None:
        super().__init__(message, {"node": node})
        self.node = node


class NotReady(ApiError):
    code, reason = 503, "NotReady"


class UpstreamError(ApiError):
    code, reason = 502, "UpstreamError"


class Timeout(ApiError):
    code, reason = 504, "Timeout"


def status_of(exc: Exception) -> Status:
    if isinstance(exc, ApiError):
        return Status(reason=exc.reason, message=exc.message, code=exc.code, details=exc.details)
    if isinstance(exc, HotmountError):  # the same mapping as `nvcli --local`'s
        return engine_status(exc)
    return Status(reason="InternalError", message="internal error; see the agent's log", code=500)
