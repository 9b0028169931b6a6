"""The agent's front door, as ASGI middleware: who calls, how much they send, how many at once.

It runs before routing, so FastAPI never reads, buffers or validates a body for a
caller it does not know, and a busy agent still answers its probes:

1. authenticate (401, whatever the body; the identity goes into the scope for the routes).
   A token the agent does not know yet costs a TokenReview: at most `max_token_reviews`
   run at once, on threads of their own, and past that bound the call gets 429 with no
   review. So distinct junk tokens against a slow API server cannot take the worker
   threads that authenticated calls run on, nor queue without end;
2. cap the body: a Content-Length over `max_body` is 413 at once; a streamed (chunked)
   body is counted as it arrives and answered 413 as soon as it passes the cap;
3. bound concurrency: at most `max_requests` API calls in the agent at once, past which
   429 with Retry-After; among them at most `max_mutating` mutating ones (anything but
   GET/HEAD/OPTIONS) at work, the others waiting in line (first come, first served, no
   worker thread held) up to `mutating_wait` seconds for a slot, then 429 as well (an
   on-demand acquire or release takes no slot: ON_DEMAND says why);
4. bound each caller: one authenticated user may have at most `max_mutating_per_caller`
   mutating calls waiting or at work, past which 429 at once (body unread). The line is
   taken before the route's authorization, so without this bound any authenticated
   caller, even one with no RBAC at all, could hold every slot and starve the others.
   The node's own operator (root on the unix socket, the static token, anonymous in
   development: identities no RBAC applies to) is one caller by design and is not
   bounded this way; the agent-wide bounds still hold for it.

Probes and the OpenAPI document are public and skip all of it: the kubelet's probes must
answer however many workers are tied up in slow mounts. /metrics is authenticated here
(the route authorizes it, like the kubelet's) but skips the bounds on API calls, unless
`--metrics-anonymous` makes it public too.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass

import anyio
import anyio.to_thread
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent.auth.authenticate import Authenticator
from agent.auth.identity import CallerContext, Identity
from agent.errors import ApiError, BadRequest, TooLarge, TooManyRequests, status_of
from agent.http.deps import IDENTITY_KEY, caller_context
from agent.metrics import Metrics

log = logging.getLogger("hotmount.agent")
METRICS_PATH = "/metrics"
PUBLIC_PATHS = frozenset(
    {"/healthz", "/readyz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
RETRY_AFTER_SECONDS = 1


@dataclass(frozen=True)
class Limits:
    max_body: int = 65536
    max_requests: int = 64
    max_mutating: int = 8
    mutating_wait: float = 10.0  # seconds a mutating call waits in line for a slot
    max_mutating_per_caller: int = 4  # one user's mutating calls waiting or at work
    max_token_reviews: int = 16  # TokenReviews in flight for tokens not known yet


class _BodyTooLarge(HTTPException):
    """Raised from `receive` mid-body; FastAPI passes HTTPExceptions through untouched."""

    def __init__(self) -> None:
        super().__init__(413)


class Guard:
    def __init__(
        self,
        app: ASGIApp,
        authenticator: Authenticator,
        limits: Limits,
        metrics: Metrics | None = None,
        metrics_public: bool = False,
    ) -> None:
        self.app, self.authenticator, self.limits = app, authenticator, limits
        self.public_paths = PUBLIC_PATHS | {METRICS_PATH} if metrics_public else PUBLIC_PATHS
        self.reviewing = 0  # TokenReviews in flight; event loop only, so no lock
        # Credentials under review now, each with the event its answer sets: a burst of
        # calls with one new token waits for that one review instead of taking the slots.
        self._in_review: dict[str, anyio.Event] = {}
        self.review_waiters = 0  # calls waiting for their token's review; event loop only
        self._review_threads: anyio.CapacityLimiter | None = None  # made on the loop
        self.requests = 0  # in the agent (waiting or at work); event loop only, so no lock
        self.mutating = 0  # mutating calls at work
        self.waiting = 0  # mutating calls in line for a slot
        self.per_caller: dict[str, int] = {}  # user -> mutating calls waiting or at work
        self._slots: anyio.Semaphore | None = None  # made on the loop, at the first call
        if metrics is not None:
            metrics.requests_in_agent.set_function(lambda: self.requests)
            metrics.mutating_waiting.set_function(lambda: self.waiting)
            metrics.token_reviews.labels("reviewing").set_function(lambda: self.reviewing)
            metrics.token_reviews.labels("waiting").set_function(lambda: self.review_waiters)
            metrics.token_reviews_limit.set(limits.max_token_reviews)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.public_paths:
            await self.app(scope, receive, send)
            return
        try:
            identity = await self._identify(caller_context(Request(scope)))
            scope[IDENTITY_KEY] = identity
            scope.setdefault("state", {})["user"] = identity.name
        except ApiError as exc:
            await _answer(exc, scope, receive, send)
            return
        if scope["path"] == METRICS_PATH:  # a scrape: authorized by its route, not bounded
            await self.app(scope, receive, send)
            return
        try:
            self._check_length(scope)
            mutating = scope["method"] not in SAFE_METHODS
            self._check_requests()
            bounded_caller = None if identity.trusted else identity.name
            if mutating and bounded_caller is not None:
                self._check_caller(bounded_caller)
        except ApiError as exc:
            await _answer(exc, scope, receive, send)
            return
        self.requests += 1
        try:
            if not mutating:
                await self._bounded(scope, receive, send)
                return
            await self._mutate(bounded_caller, scope, receive, send, _needs_slot(scope))
        finally:
            self.requests -= 1

    async def _identify(self, caller: CallerContext) -> Identity:
        """On the loop when no API call is needed (a thread hop costs more than the check);
        a TokenReview on a thread of the review limiter, or 429 when it is full. A call
        whose token is under review already waits for that review (taking no slot), then
        authenticates afresh: its answer is cached by then, unless it was refused."""
        identity = self.authenticator.authenticate_without_io(caller)
        if identity is not None:
            return identity
        credential = caller.first("authorization") or ""
        pending = self._in_review.get(credential)
        if pending is not None:
            self.review_waiters += 1
            try:
                await pending.wait()
            finally:
                self.review_waiters -= 1
            identity = self.authenticator.authenticate_without_io(caller)
            if identity is not None:
                return identity
        if self.reviewing >= self.limits.max_token_reviews:
            raise TooManyRequests(
                f"the agent is checking {self.reviewing} unknown tokens with the API "
                "server, its limit; retry shortly",
                RETRY_AFTER_SECONDS,
            )
        if self._review_threads is None:
            self._review_threads = anyio.CapacityLimiter(self.limits.max_token_reviews)
        self.reviewing += 1
        leading = credential not in self._in_review
        if leading:
            self._in_review[credential] = anyio.Event()
        try:
            return await anyio.to_thread.run_sync(
                self.authenticator.authenticate, caller, limiter=self._review_threads
            )
        finally:
            self.reviewing -= 1
            if leading:
                self._in_review.pop(credential).set()

    async def _mutate(
        self, caller: str | None, scope: Scope, receive: Receive, send: Send, slot: bool = True
    ) -> None:
        """A mutating call: counted against its caller (None: the node's operator, not
        counted) from the line to the answer; `slot`: it takes one of the mutating slots."""
        if caller is not None:
            self.per_caller[caller] = self.per_caller.get(caller, 0) + 1
        try:
            if not slot:
                await self._bounded(scope, receive, send)
                return
            if not await self._take_slot():
                await _answer(self._too_many_mutating(), scope, receive, send)
                return
            self.mutating += 1
            try:
                await self._bounded(scope, receive, send)
            finally:
                self.mutating -= 1
                assert self._slots is not None
                self._slots.release()
        finally:
            if caller is not None:
                left = self.per_caller[caller] - 1
                if left:
                    self.per_caller[caller] = left
                else:
                    del self.per_caller[caller]  # no entry kept per user who has gone

    async def _take_slot(self) -> bool:
        """Wait in line for a mutating slot, up to `mutating_wait` seconds."""
        if self._slots is None:
            self._slots = anyio.Semaphore(self.limits.max_mutating, fast_acquire=True)
        with contextlib.suppress(anyio.WouldBlock):
            self._slots.acquire_nowait()
            return True
        if self.limits.mutating_wait <= 0:
            return False
        self.waiting += 1
        try:
            with anyio.move_on_after(self.limits.mutating_wait):
                await self._slots.acquire()
                return True
            return False
        finally:
            self.waiting -= 1

    def _check_length(self, scope: Scope) -> None:
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    raise BadRequest("Content-Length is not a number") from None
                if length > self.limits.max_body:
                    raise self._too_large()

    def _check_requests(self) -> None:
        if self.requests >= self.limits.max_requests:
            raise TooManyRequests(
                f"the agent is serving {self.requests} calls, its limit; retry shortly",
                RETRY_AFTER_SECONDS,
            )

    def _check_caller(self, caller: str) -> None:
        if self.per_caller.get(caller, 0) >= self.limits.max_mutating_per_caller:
            raise TooManyRequests(
                f"{caller} already has {self.limits.max_mutating_per_caller} mounts, "
                "unmounts or moves waiting or at work, the limit per caller; retry when "
                "one is answered",
                RETRY_AFTER_SECONDS,
            )

    def _too_many_mutating(self) -> TooManyRequests:
        waited = f" ({self.limits.mutating_wait:g} s in line)" if self.limits.mutating_wait else ""
        return TooManyRequests(
            f"the agent is serving {self.mutating} mounts, unmounts or moves, its limit, "
            f"and no slot freed{waited}; retry shortly",
            RETRY_AFTER_SECONDS,
        )

    def _too_large(self) -> TooLarge:
        return TooLarge(f"the request body is over {self.limits.max_body} bytes")

    async def _bounded(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app with a receive that stops at the cap; then whatever the app
        made of the cut-off body is dropped and the caller gets 413."""
        received, over, started = 0, False, False

        async def counted() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limits.max_body:
                    over = True
                    raise _BodyTooLarge()
            return message

        async def guarded(message: Message) -> None:
            nonlocal started
            if over:
                return
            started = True
            await send(message)

        with contextlib.suppress(_BodyTooLarge):  # raised by `counted`, answered below
            await self.app(scope, counted, guarded)
        if over and not started:
            await _answer(self._too_large(), scope, receive, send)


async def _answer(exc: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
    status = status_of(exc)
    log.info("refused %s %s: %s %s", scope["method"], scope["path"], status.code, status.message)
    headers = {}
    if isinstance(exc, TooManyRequests):
        headers["retry-after"] = str(exc.retry_after)
    response = JSONResponse(
        status.model_dump(by_alias=True, exclude_none=True),
        status_code=status.code,
        headers=headers,
    )
    await response(scope, receive, send)


# On-demand calls (agent/ondemand/arbiter.py) take no mutating slot: a cell's acquire may
# wait up to 20 s for a GPU, and a slot held that long would stop the node's mounts. They
# do no mount themselves (the arbiter's few hand-over workers do), and the arbiter bounds
# how many of them wait on a worker thread; each caller is still bounded here.
ON_DEMAND = re.compile(
    r"/(v1/namespaces/[^/]+/pods|apis/hotmount\.io/v1alpha1/namespaces/[^/]+/gpumounts)"
    r"/[^/]+/(acquire|release)"
)


def _needs_slot(scope: Scope) -> bool:
    return not (scope["method"] == "POST" and ON_DEMAND.fullmatch(str(scope["path"])))
