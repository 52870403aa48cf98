"""Error answers: JSON ``{"detail", "field"}``, never a stack trace; 422 names the offending field."""

from __future__ import annotations

import logging

from fastapi import FastAPI, HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.submissions import BadRequest

log = logging.getLogger("autoshard.api")
UNPROCESSABLE = 422


def field_of(location: tuple) -> str:
    """``("body", "mesh", "shape", 0)`` -> ``mesh.shape[0]``; ``("query", "limit")`` -> ``limit``."""
    parts = [str(p) for p in location[1:]] if location and location[0] in ("body", "query", "path") else []
    text = ""
    for part in parts:
        text += f"[{part}]" if part.isdigit() else (f".{part}" if text else part)
    return text or (str(location[0]) if location else "body")


async def _validation(_request: Request, error: RequestValidationError) -> JSONResponse:
    first = error.errors()[0]
    location = tuple(first.get("loc", ()))
    if first.get("type") == "json_invalid":
        return _answer(UNPROCESSABLE, f"body: malformed JSON: {first.get('msg')}", "body")
    field = field_of(location)
    if first.get("type") == "extra_forbidden":
        return _answer(UNPROCESSABLE, f"{field}: unknown field", field)
    return _answer(UNPROCESSABLE, f"{field}: {first.get('msg')}", field)


async def _bad_request(_request: Request, error: BadRequest) -> JSONResponse:
    return _answer(error.status, str(error), error.field)


async def _http(_request: Request, error: StarletteHTTPException) -> JSONResponse:
    return _answer(error.status_code, str(error.detail), None, getattr(error, "headers", None))


async def _unexpected(request: Request, error: Exception) -> JSONResponse:
    request_id = getattr(request.state, "request_id", "-")
    log.error("request %s: %s %s failed", request_id, request.method, request.url.path, exc_info=error)
    detail = f"internal error (logged on the server as request {request_id})"
    return _answer(status.HTTP_500_INTERNAL_SERVER_ERROR, detail, None, {"X-Request-ID": request_id})


def too_busy(message: str, retry_after_s: int) -> HTTPException:
    """A 429 with ``Retry-After``: the queue, a principal's caps or a pool of processes is full."""
    return HTTPException(
        status.HTTP_429_TOO_MANY_REQUESTS, message, headers={"Retry-After": str(retry_after_s)}
    )


def _answer(code: int, detail: str, field: str | None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail, "field": field}, status_code=code, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)  # type: ignore[arg-type]
    app.add_exception_handler(BadRequest, _bad_request)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)
