"""Structured JSON logs, each line carrying the request id of the request it belongs to."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import threading
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if (rid := request_id.get()) is not None:
            entry["requestId"] = rid
        for key in ("method", "path", "status", "durationMs", "user"):
            if hasattr(record, key):
                entry[key] = getattr(record, key)
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class OncePerProcess(logging.Filter):
    """uvicorn runs one Server per `--listen` address, and each logs the *process's*
    lifecycle ("Started server process [pid]", "Shutting down", ...): with a TCP and a
    unix listener every such line came out twice. Let each through once; lines that
    differ per listener ("Uvicorn running on ...") and errors are untouched."""

    LIFECYCLE = frozenset(
        {
            "Started server process [%d]",
            "Waiting for application startup.",
            "Application startup complete.",
            "Shutting down",
            "Waiting for application shutdown.",
            "Application shutdown complete.",
            "Finished server process [%d]",
        }
    )

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in self.LIFECYCLE:
            return True
        line = record.getMessage()
        with self._lock:
            if line in self._seen:
                return False
            self._seen.add(line)
            return True


def configure(level: str) -> None:
    """One JSON handler, on the root logger only: every other logger propagates to it."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.Formatter.converter = time.gmtime
    uvicorn_log = logging.getLogger("uvicorn.error")
    for old in [f for f in uvicorn_log.filters if isinstance(f, OncePerProcess)]:
        uvicorn_log.removeFilter(old)
    uvicorn_log.addFilter(OncePerProcess())


class RequestIdMiddleware:
    """Takes X-Request-Id or makes one, echoes it back, and logs one line per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.log = logging.getLogger("hotmount.access")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers", [])).get(b"x-request-id", b"").decode("latin-1")
        rid = given[:64] if given else uuid.uuid4().hex
        token = request_id.set(rid)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            state = scope.get("state") or {}
            self.log.info(
                "request",
                extra={
                    "method": scope.get("method"),
                    "path": scope.get("path"),
                    "status": status,
                    "durationMs": round((time.perf_counter() - started) * 1000, 3),
                    "user": state.get("user"),
                },
            )
            request_id.reset(token)
