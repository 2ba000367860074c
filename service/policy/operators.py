"""Who may use the console: `ORDERS_CONSOLE_TOKENS`, parsed and matched (pure; no I/O: the settings check the list
as they load, the console matches what a caller presents)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Role = Literal["viewer", "operator"]
ROLES: tuple[Role, ...] = ("viewer", "operator")
MIN_TOKEN_LENGTH = 32


@dataclass(frozen=True)
class Operator:
    """Someone the console knows: a name (the audit's actor), a role, and a fingerprint of their token."""

    name: str
    role: Role
    fingerprint: str  # sha256 of the token: sessions name it, so a token removed from the list ends them

    @property
    def acts(self) -> bool:
        """Whether this one may reveal payloads and act (operators), not only read (viewers)."""
        return self.role == "operator"


def fingerprint(token: str) -> str:
    """A token's fingerprint: what a session keeps instead of the token."""
    return hashlib.sha256(token.encode()).hexdigest()


def parse_tokens(value: str) -> dict[str, Operator]:
    """`name:role:token,…` as {token: operator}; ValueError naming the entry by position, never the token."""
    operators: dict[str, Operator] = {}
    names: set[str] = set()
    for position, entry in enumerate((part.strip() for part in value.split(",")), start=1):
        if not entry:
            continue
        name, role, token = [*entry.split(":", 2), "", ""][:3]
        name, role, token = name.strip(), role.strip(), token.strip()
        # A name as long as a token is not repeated: it may be a token written first (`token:name:role`).
        named = f"entry {position} ({name})" if len(name) < MIN_TOKEN_LENGTH else f"entry {position}"
        if not name or not token:
            raise ValueError(f"entry {position}: must be name:role:token")
        if len(name) >= MIN_TOKEN_LENGTH:
            raise ValueError(f"{named}: the name is as long as a token: is the entry written name:role:token?")
        if role not in ROLES:
            raise ValueError(f"{named}: the role must be viewer or operator")
        if len(token) < MIN_TOKEN_LENGTH:
            raise ValueError(f"{named}: the token must be at least {MIN_TOKEN_LENGTH} characters")
        if name in names:
            raise ValueError(f"{named}: the name is given twice")
        if token in operators:
            raise ValueError(f"{named}: the same token as another entry")
        names.add(name)
        operators[token] = Operator(name, role, fingerprint(token))
    return operators


def match(operators: Mapping[str, Operator], presented: str) -> Operator | None:
    """The operator whose token was presented, compared in constant time against every configured token (how
    long it takes says nothing of how close a guess was, nor which token it resembled)."""
    found = None
    given = presented.encode()
    for token, operator in operators.items():
        if hmac.compare_digest(token.encode(), given):
            found = operator
    return found
