"""Who owns a quarantined record: a queue nobody owns is deferred data loss.

By default bad input belongs to the team that produced it, and exhausted retries belong to this service's on-call;
the domain names both (`Owners`). `<PREFIX>QUARANTINE_OWNERS=CODE=team,…` overrides per error code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from service.codes import ErrorCode, FailureKind


@dataclass(frozen=True)
class Owners:
    """The default owners of quarantined records: `producers` own bad input, `oncall` exhausted retries."""

    producers: str
    oncall: str


def owner_for(code: ErrorCode, owners: Owners, overrides: Mapping[str, str] | None = None) -> str:
    """The owner of a quarantined record with this error code."""
    if overrides and code.value in overrides:
        return overrides[code.value]
    invalid = code.kind is FailureKind.INVALID and not code.value.endswith("_EXHAUSTED")
    return owners.producers if invalid else owners.oncall


def parse_owners(text: str) -> dict[str, str]:
    """Read `CODE=owner,CODE=owner`; raise ValueError naming what is wrong."""
    owners: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        code, _, owner = part.partition("=")
        code, owner = code.strip(), owner.strip()
        if code not in ErrorCode.__members__ or not owner:
            raise ValueError(f"{part!r} is not CODE=owner with a known error code")
        owners[code] = owner
    return owners
