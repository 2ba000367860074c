"""Crash points for the failure tests: the process kills itself (SIGKILL) at a named point.

`ORDERS_FAULT_CRASH_AT=after-commit` makes a consumer die right after its business transaction committed
and before the offset commit; `mid-write` makes it die with a batch's transaction written but not committed;
`after-publish` makes a relay die after Kafka acknowledged and before the rows are marked published.
Unset in production. A real SIGKILL, not an exception, so no `finally` runs.

`ORDERS_FAULT_FAIL_AT=quarantine-write` makes every ordinary quarantine write fail, so the last-resort path
(service/worker/processor.py) is shown to quarantine the record anyway.
"""

from __future__ import annotations

import os
import signal


class InjectedFault(Exception):
    """A failure a test asked for (ORDERS_FAULT_FAIL_AT), standing for content the store refuses."""


def fail_point(name: str, armed: str | None) -> None:
    """Fail here, as a write the database refuses would, when this point is the armed one."""
    if armed == name:
        raise InjectedFault(name)


def crash_point(name: str, armed: str | None) -> None:
    """Die here, like a power cut, when this point is the armed one."""
    if armed == name:
        os.kill(os.getpid(), signal.SIGKILL)
