"""The faults a route can be scripted with (service/testing/faults.py): a queued fault or an outage, the checks of
their arguments, and how one plays out on a call."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from service.testing.routes import Reply
from service.testing.serving import Outcome

FaultKind = Literal["fail", "delay", "cut"]

DEFAULT_FAIL_BODY: Final = {"error": "injected"}
# Statuses that cannot carry a body; an injected failure always sends one.
BODYLESS_STATUSES: Final = frozenset({204, 304})


@dataclass(frozen=True, slots=True)
class Fault:
    """One queued fault; it is consumed by exactly one call of its route."""

    kind: FaultKind
    status: int = 503
    retry_after: str | None = None
    body: bytes = b""
    seconds: float = 0.0
    after_apply: bool = True
    key: str | None = None  # only calls whose route reads this key; None = any call
    content_type: str | None = None  # a failure's own Content-Type (an HTML page); None: application/json
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Outage:
    """A route that fails every call until `until` (monotonic seconds): `status`, and every `hang_every`-th call
    (0: none) answers that status only after `hang` seconds, as a downstream on its knees does."""

    until: float
    status: int
    hang_every: int
    hang: float


async def play(fault: Fault | None, apply: Callable[[], Reply]) -> Outcome:
    """Apply a call through its fault: fail it, cut it before or after applying, or delay its answer."""
    if fault is not None and fault.kind == "fail":
        if fault.seconds:
            await asyncio.sleep(fault.seconds)
        headers = fault.headers if fault.retry_after is None else (*fault.headers, ("Retry-After", fault.retry_after))
        if fault.content_type is not None:
            headers = (("Content-Type", fault.content_type), *headers)  # "" sends none
        return Reply(fault.status, fault.body, headers)
    if fault is not None and fault.kind == "cut" and not fault.after_apply:
        return "cut"
    reply = apply()
    if fault is not None and fault.kind == "cut":
        return "cut"
    if fault is not None and fault.kind == "delay":
        await asyncio.sleep(fault.seconds)
    return reply


def check_times(times: int) -> None:
    """Raise ValueError unless times is a positive integer."""
    if isinstance(times, bool) or not isinstance(times, int) or times < 1:
        raise ValueError(f"times must be a positive integer, got {times!r}")


def check_seconds(seconds: float) -> float:
    """The seconds as a float; ValueError unless they are a non-negative number."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise ValueError(f"seconds must be a non-negative number, got {seconds!r}")
    return float(seconds)


def format_retry_after(retry_after: float | str) -> str:
    """Render Retry-After: whole seconds as an integer (the RFC form), anything else verbatim."""
    if isinstance(retry_after, str):
        return retry_after
    if isinstance(retry_after, bool) or retry_after < 0:
        raise ValueError(f"retry_after must be a non-negative number or a string, got {retry_after!r}")
    return str(int(retry_after)) if float(retry_after).is_integer() else str(retry_after)


def optional_key(payload: dict[str, Any]) -> str | None:
    """The optional `key` a control request limits its fault to."""
    key = payload.get("key")
    if key is not None and not isinstance(key, str):
        raise ValueError("key must be a string")
    return key
