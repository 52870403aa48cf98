"""Typed dependencies of the routes: settings, a database session, the metrics, and the principal a
request's bearer token acts as (with the scope the route needs)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.access import EVERYONE, METRICS, READ, SUBMIT, Principal, principal_of
from service.jobs.metrics import Metrics
from service.settings import Settings
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
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def optional_principal(settings: SettingsDep, credentials: Credentials) -> Principal | None:
    """The principal of the request's token; None without a known token (everyone when auth is off)."""
    if not settings.tokens:
        return EVERYONE
    entries = settings.tokens.get(credentials.credentials) if credentials is not None else None
    return None if entries is None else principal_of(credentials.credentials, entries)  # type: ignore[union-attr]


def require(scope: str) -> Callable[..., Principal]:
    """A dependency giving the principal of a request whose token carries ``scope`` (every request when no
    tokens are set): 401 without a known token, 403 with one that lacks the scope."""

    def check(principal: Annotated[Principal | None, Depends(optional_principal)]) -> Principal:
        if principal is None:
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "a valid bearer token is required",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not principal.may(scope):
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"this token lacks the {scope!r} scope")
        return principal

    return check


Reader = Annotated[Principal, Depends(require(READ))]
Submitter = Annotated[Principal, Depends(require(SUBMIT))]
Monitor = Annotated[Principal, Depends(require(METRICS))]
MaybePrincipal = Annotated[Principal | None, Depends(optional_principal)]
CanRead = Depends(require(READ))
