"""ASGI middleware: the request body limit (413) and the request latency histogram."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.jobs.metrics import Metrics

log = logging.getLogger("autoshard.api")
REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class BodyTooLarge(HTTPException):
    """Raised while reading a body past the limit: the routes pass it on, the error handler answers 413."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"body: larger than {max_bytes} bytes")


class BodyLimit:
    """Answers 413 when a body is larger than ``max_bytes``: by its Content-Length before reading it, or
    while reading a body sent in chunks."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(send)
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps({"detail": f"body: larger than {self.max_bytes} bytes", "field": "body"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class RequestTimer:
    """Observes each request's latency by method, route template and status; gives each request an id
    (the client's ``X-Request-ID`` if it sent a usable one), answered in ``X-Request-ID`` and logged with the
    request's outcome."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: dict[str, Any] = {"code": 500}
        request_id = _request_id(scope)
        scope.setdefault("state", {})["request_id"] = request_id

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", "unmatched")
            seconds = time.perf_counter() - started
            self.metrics.request_seconds.labels(scope["method"], template, str(status["code"])).observe(
                seconds
            )
            log.log(
                logging.WARNING if status["code"] >= 500 else logging.DEBUG,
                "request %s %s %s -> %s in %.1f ms",
                request_id,
                scope["method"],
                scope["path"],
                status["code"],
                1e3 * seconds,
            )


def _request_id(scope: Scope) -> str:
    sent = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
    if REQUEST_ID.fullmatch(sent):
        return sent
    return uuid.uuid4().hex[:16]
