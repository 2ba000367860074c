"""Console sessions: an opaque random token in the cookie, a row in the database found by its hash (so that a
logout or an expiry holds on every console replica), the session's CSRF token derived from it; and the limit on
failed logins."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncConnection

from service.policy.operators import Operator
from service.store import console_sessions

COOKIE = "console_session"
_TOKEN = re.compile(r"[A-Za-z0-9_-]{43}")  # what `secrets.token_urlsafe(32)` makes


@dataclass(frozen=True)
class Session:
    """A logged-in operator and the CSRF token every form and htmx request of the session carries."""

    operator: Operator
    csrf: str


def _derived(token: str, purpose: str) -> str:
    # One-way and apart by purpose: the CSRF token a page shows says nothing of the row's key, nor of the cookie.
    return hmac.new(token.encode(), purpose.encode(), hashlib.sha256).hexdigest()


def session_id_hash(token: str) -> str:
    """What the database keeps of a session's token: its row's key."""
    return _derived(token, "console session id")


class Sessions:
    """Opens, reads and ends sessions. A session holds while its row is live (not revoked, not expired), its
    operator's token is still configured under the same name and role, and the token list is the one it was
    opened under: removing a token ends its sessions at once, and any change to the list ends them all."""

    def __init__(self, operators: Iterable[Operator], tokens: Iterable[str], ttl_seconds: float, program: str) -> None:
        self._by_fingerprint = {operator.fingerprint: operator for operator in operators}
        # The digest's label names the service (its program), so that two services' consoles never read each other's.
        label = f"{program} console session".encode()
        self._tokens_digest = hmac.new(label, "\n".join(sorted(tokens)).encode(), hashlib.sha256).hexdigest()
        self.ttl_seconds = ttl_seconds

    @property
    def _ttl(self) -> timedelta:
        return timedelta(seconds=self.ttl_seconds)

    async def issue(self, connection: AsyncConnection, operator: Operator) -> tuple[str, Session]:
        """A new session for `operator`: its cookie value, and the session (with its CSRF token)."""
        token = secrets.token_urlsafe(32)
        await console_sessions.issue(
            connection,
            session_id_hash(token),
            console_sessions.SessionRow(operator.name, operator.role, operator.fingerprint, self._tokens_digest),
            self._ttl,
        )
        return token, Session(operator, _derived(token, "console session csrf"))

    async def read(self, connection: AsyncConnection, cookie: str | None) -> Session | None:
        """The session a cookie names: None when absent, unknown, revoked, expired, or of a token (or token list)
        no longer configured."""
        if not cookie or not _TOKEN.fullmatch(cookie):
            return None
        row = await console_sessions.live(connection, session_id_hash(cookie), self._ttl)
        if row is None or row.tokens_digest != self._tokens_digest:
            return None
        operator = self._by_fingerprint.get(row.fingerprint)
        if operator is None or (operator.name, operator.role) != (row.operator, row.role):
            return None
        return Session(operator, _derived(cookie, "console session csrf"))

    async def end(self, connection: AsyncConnection, cookie: str | None) -> bool:
        """Revoke the session a cookie names (logout); False when there was none live."""
        if not cookie or not _TOKEN.fullmatch(cookie):
            return False
        return await console_sessions.revoke(connection, session_id_hash(cookie))


class LoginLimiter:
    """At most `attempts` failed logins per client in `window` seconds; beyond that, logins are refused until
    the oldest failure leaves the window (even a right token: a guesser learns nothing from a refusal)."""

    def __init__(self, attempts: int = 5, window: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._attempts, self._window, self._clock = attempts, window, clock
        self._failures: dict[str, deque[float]] = {}

    def _recent(self, client: str) -> deque[float]:
        now = self._clock()
        failures = self._failures.setdefault(client, deque())
        while failures and failures[0] <= now - self._window:
            failures.popleft()
        if not failures:
            del self._failures[client]  # the table holds only clients that failed lately
            return deque()
        return failures

    def blocked(self, client: str) -> float | None:
        """Seconds until `client` may try again (None: it may now)."""
        failures = self._recent(client)
        if len(failures) < self._attempts:
            return None
        # Until the failure that made it `attempts` leaves the window (two racing failures can make more).
        return max(0.0, failures[-self._attempts] + self._window - self._clock())

    def failed(self, client: str) -> None:
        """Count one failed login of `client`."""
        self._recent(client)
        self._failures.setdefault(client, deque()).append(self._clock())
