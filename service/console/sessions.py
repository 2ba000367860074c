"""Console sessions: a signed, expiring cookie that names an operator's token fingerprint and the session's
CSRF token; and the limit on failed logins."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeTimedSerializer

from service.policy.operators import Operator

COOKIE = "console_session"


@dataclass(frozen=True)
class Session:
    """A logged-in operator and the CSRF token every form and htmx request of the session carries."""

    operator: Operator
    csrf: str


class Sessions:
    """Issues and reads session cookies. The signing key is derived from the configured tokens, so every
    replica with the same configuration accepts the same cookie, and changing the tokens ends every session;
    a removed token ends its own at once (the cookie names its fingerprint, looked up on every request)."""

    def __init__(self, operators: Iterable[Operator], tokens: Iterable[str], ttl_seconds: float, program: str) -> None:
        self._by_fingerprint = {operator.fingerprint: operator for operator in operators}
        # The key's label names the service (its program), so that two services' consoles never read each other's.
        label = f"{program} console session".encode()
        key = hmac.new(label, "\n".join(sorted(tokens)).encode(), hashlib.sha256)
        self._serializer = URLSafeTimedSerializer(key.hexdigest(), salt="console-session")
        self.ttl_seconds = ttl_seconds

    def issue(self, operator: Operator) -> tuple[str, Session]:
        """A new session for `operator`: its cookie value, and the session (with a fresh CSRF token)."""
        session = Session(operator, secrets.token_urlsafe(32))
        return self._serializer.dumps({"f": operator.fingerprint, "c": session.csrf}), session

    def read(self, cookie: str | None) -> Session | None:
        """The session a cookie holds: None when absent, forged, expired or of a token no longer configured."""
        if not cookie:
            return None
        try:
            content = self._serializer.loads(cookie, max_age=int(self.ttl_seconds))
        except (BadSignature, ValueError, TypeError):
            return None
        if not isinstance(content, dict):
            return None
        operator = self._by_fingerprint.get(str(content.get("f")))
        csrf = content.get("c")
        if operator is None or not isinstance(csrf, str):
            return None
        return Session(operator, csrf)


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
