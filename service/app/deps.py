"""Typed dependencies of the routes: settings, a database session, the metrics, and bearer-token rights."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.app.settings import READ, SUBMIT, Settings
from service.jobs.metrics import Metrics
from service.store.plan_cache import PlanCache
from service.store.session import Store


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_store(request: Request) -> Store:
    return request.app.state.store


def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


def get_plan_cache(request: Request) -> PlanCache:
    return request.app.state.plan_cache


def get_session(store: Annotated[Store, Depends(get_store)]) -> Iterator[Session]:
    """A session for one request; routes that write commit before they answer (the exit of this
    dependency may run after the answer is sent)."""
    with store.new_session() as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
SessionDep = Annotated[Session, Depends(get_session)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
PlanCacheDep = Annotated[PlanCache, Depends(get_plan_cache)]

_bearer = HTTPBearer(auto_error=False, description="a token from AUTOSHARD_TOKENS (when auth is on)")


def require(right: str) -> Callable[..., None]:
    """A dependency passing requests whose bearer token carries ``right`` (all, when no tokens are set):
    401 without a known token, 403 with one that lacks the right."""

    def check(
        settings: SettingsDep,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> None:
        if not settings.tokens:
            return
        rights = settings.tokens.get(credentials.credentials) if credentials is not None else None
        if rights is None:
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "a valid bearer token is required",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if right not in rights:
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"this token lacks the {right!r} right")

    return check


CanRead = Depends(require(READ))
CanSubmit = Depends(require(SUBMIT))
