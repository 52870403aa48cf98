"""Who is asking and what they may do: bearer tokens, their scopes and the principal they act as.

A token's scopes (``AUTOSHARD_TOKENS``, token -> scopes) are ``read`` (GET), ``submit`` (POST, DELETE),
``admin`` (every principal's jobs and plans), ``metrics`` (``/metrics`` and the detailed ``/readyz``), and
``principal:NAME``: the principal the token acts as, so several tokens (a launcher's and its operator's) share
one principal's jobs and plans. A token without a name is a principal of its own, named by a digest of the
token (the token itself is never stored). Without tokens the service has one principal,
:data:`ANONYMOUS`, with every scope.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

READ, SUBMIT, ADMIN, METRICS = "read", "submit", "admin", "metrics"
SCOPES = (READ, SUBMIT, ADMIN, METRICS)
PRINCIPAL_PREFIX = "principal:"
ANONYMOUS = "anonymous"
"""The principal of every request when authentication is off."""
MAX_PRINCIPAL = 64
"""Characters of a principal's name (the jobs table's owner column holds 128)."""


@dataclass(frozen=True)
class Principal:
    """One requester: its name (the owner recorded on its jobs and plans) and its scopes."""

    name: str
    scopes: frozenset[str]

    @property
    def is_admin(self) -> bool:
        return ADMIN in self.scopes

    def may(self, scope: str) -> bool:
        """Whether this principal has ``scope``; ``admin`` has every scope."""
        return scope in self.scopes or self.is_admin

    @property
    def owner_filter(self) -> str | None:
        """The owner its queries are restricted to: None (all) for an admin."""
        return None if self.is_admin else self.name


EVERYONE = Principal(ANONYMOUS, frozenset(SCOPES))
"""The principal of a service without tokens."""


def principal_of(token: str, entries: list[str]) -> Principal:
    """The principal a token acts as, from its configured entries (scopes and an optional name)."""
    names = [entry[len(PRINCIPAL_PREFIX) :] for entry in entries if entry.startswith(PRINCIPAL_PREFIX)]
    scopes = frozenset(entry for entry in entries if not entry.startswith(PRINCIPAL_PREFIX))
    name = names[0] if names else "token-" + hashlib.sha256(token.encode()).hexdigest()[:16]
    return Principal(name, scopes)


def check_tokens(tokens: dict[str, list[str]]) -> None:
    """Refuse a token configuration with unknown scopes, two names for one token or an empty name
    (a mistake here must stop the server at start, not grant or deny at random later)."""
    for token, entries in tokens.items():
        label = f"a token ending {token[-4:]!r}" if len(token) >= 8 else "a short token"
        if not token:
            raise ValueError("tokens: an empty token")
        names = [entry for entry in entries if entry.startswith(PRINCIPAL_PREFIX)]
        unknown = sorted(set(entries) - set(SCOPES) - set(names))
        if unknown:
            raise ValueError(f"tokens: {label} has unknown scope {unknown[0]!r}; scopes are {list(SCOPES)}")
        if len(names) > 1:
            raise ValueError(f"tokens: {label} names {len(names)} principals; give at most one")
        if names and not 0 < len(names[0]) - len(PRINCIPAL_PREFIX) <= MAX_PRINCIPAL:
            raise ValueError(f"tokens: {label} has a principal name of 1 to {MAX_PRINCIPAL} characters")
