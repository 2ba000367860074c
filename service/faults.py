"""Crash points for the failure tests: the process kills itself (SIGKILL) at a named point.

`ORDERS_FAULT_CRASH_AT=after-commit` makes a consumer die right after its business transaction committed
and before the offset commit; `mid-write` makes it die with a batch's transaction written but not committed;
`after-publish` makes a relay die after Kafka acknowledged and before the rows are marked published.
Unset in production. A real SIGKILL, not an exception, so no `finally` runs.
"""

from __future__ import annotations

import os
import signal


def crash_point(name: str, armed: str | None) -> None:
    """Die here, like a power cut, when this point is the armed one."""
    if armed == name:
        os.kill(os.getpid(), signal.SIGKILL)
