"""Cross-cutting behaviour around a round's calls, as small wrappers (as FastStream's middleware wrap a
subscriber): a look-up's timeout and the classification of its failures, and the fault and crash points the
failure tests arm around the round's write and commit. Each takes a call and returns a call of the same shape, so
they compose; points that are not armed leave the call as it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from service.codes import ErrorCode
from service.errors import RecordFailure
from service.faults import crash_point, fail_point
from service.policy.classify import Failure
from service.policy.decide import RoundWrite
from service.store.round_write import Rows

log = structlog.get_logger("processor")

LookUp = Callable[[str], Awaitable[Any]]  # a key's outside fact (`Handler.look_up`)
Apply = Callable[[RoundWrite[Rows]], Awaitable[None]]  # a round's write, in its open transaction
Commit = Callable[[], Awaitable[None]]
C = TypeVar("C")


def timed(seconds: float) -> Callable[[LookUp], LookUp]:
    """A look-up that takes longer than `seconds` raises `TimeoutError`."""

    def wrap(call: LookUp) -> LookUp:
        async def look_up(key: str) -> Any:
            async with asyncio.timeout(seconds):
                return await call(key)

        return look_up

    return wrap


def classified(downstream: str) -> Callable[[LookUp], LookUp]:
    """A look-up that fails returns its `Failure` instead of raising: a timeout is `PROCESSING_TIMEOUT` (of
    `downstream`), a `RecordFailure` its own code, anything else `UNEXPECTED_ERROR`. (A domain's fact is never a
    `Failure`: the caller tells them apart by type.)"""

    def wrap(call: LookUp) -> LookUp:
        async def look_up(key: str) -> Any:
            try:
                return await call(key)
            except TimeoutError:
                return Failure(ErrorCode.PROCESSING_TIMEOUT, downstream=downstream)
            except RecordFailure as error:
                return Failure(error.code, error.retry_after, error.downstream, error.charged)
            except Exception as error:
                log.debug("lookup_failed", exc_info=error)
                return Failure(ErrorCode.UNEXPECTED_ERROR)

        return look_up

    return wrap


@dataclass(frozen=True, slots=True)
class FaultPoints:
    """The failure tests' armed points (ORDERS_FAULT_FAIL_AT, ORDERS_FAULT_CRASH_AT; service/faults.py); none in
    production."""

    fail_at: str | None = None
    crash_at: str | None = None

    @property
    def armed(self) -> bool:
        """Whether any point is armed."""
        return self.fail_at is not None or self.crash_at is not None


def _unchanged(call: C) -> C:
    return call


def faulty_write(points: FaultPoints) -> Callable[[Apply], Apply]:
    """`quarantine-write` fails an ordinary quarantine's write (so the last resort is seen to take over); `mid-write`
    kills the process with the round written and not committed."""
    if not points.armed:
        return _unchanged

    def wrap(apply: Apply) -> Apply:
        async def applied(write: RoundWrite[Rows]) -> None:
            if write.rows.quarantined and not write.last_resort:
                fail_point("quarantine-write", points.fail_at)
            await apply(write)
            crash_point("mid-write", points.crash_at)

        return applied

    return wrap


def faulty_commit(points: FaultPoints) -> Callable[[Commit], Commit]:
    """`after-commit` kills the process with the round committed and its offsets not."""
    if points.crash_at is None:
        return _unchanged

    def wrap(commit: Commit) -> Commit:
        async def committed() -> None:
            await commit()
            crash_point("after-commit", points.crash_at)

        return committed

    return wrap
