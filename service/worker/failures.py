"""The shell of the next-step decision: what follows the failed attempts of a round, applied.

`next_step` (service/policy/next_step.py) decides for each failed delivery; this class reads the clocks and the
process's own downtime for it, and does what a step needs beyond its new retry state: the failure metrics and the
`record_failed` line (a record waiting for its downstream's breaker spends nothing and is not counted: the breaker's
own line and metrics say it once, service/adapters/breakers.py).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from datetime import datetime

import structlog

from service.metrics import Metrics
from service.policy.classify import Failure
from service.policy.delivery import Delivery, RetryState
from service.policy.next_step import Budgets, Quarantine, RetryInPlace, ToTier, Wait, next_step
from service.policy.records import trace_id_of
from service.policy.round import Round
from service.worker.downtime import Downtime

log = structlog.get_logger("processor")


class Failures:
    """Decides and applies the next steps of a consumer's failed deliveries."""

    def __init__(
        self,
        budgets: Budgets,
        metrics: Metrics,
        clock: Callable[[], datetime],
        rng: random.Random,
        downtime: Downtime,
        consumer: str,
    ) -> None:
        self._budgets = budgets
        self._consumer = consumer  # whose derived trace ids the log lines name
        self._metrics = metrics
        self._clock = clock
        self._rng = rng
        self._downtime = downtime

    def decide(self, round_: Round, failures: dict[Delivery, Failure]) -> dict[Delivery, RetryState]:
        """The next step of each failed delivery of the round, applied; return their new retry states."""
        if not failures:
            return {}
        now = self._clock()
        loop_now = asyncio.get_running_loop().time()
        downtime = self._downtime.total
        retry: dict[Delivery, RetryState] = {}
        for delivery, state in round_.due.items():
            failure = failures.get(delivery)
            if failure is None:
                continue
            step = next_step(
                delivery,
                state,
                failure,
                budgets=self._budgets,
                now=now,
                loop_now=loop_now,
                rng=self._rng,
                downtime=downtime,
            )
            retry[delivery] = step.state
            if isinstance(step, Wait):
                log.debug(
                    "record_waiting",
                    message_id=delivery.message_id,
                    downstream=failure.downstream,
                    error_code=failure.code.value,
                    wait_seconds=step.duration.total_seconds(),
                )
                continue
            if failure.charged:
                self._metrics.failure(failure.code.value, tier_of(delivery))
            delay = step.delay if isinstance(step, RetryInPlace | ToTier | Quarantine) else None
            log.info(
                "record_failed",
                message_id=delivery.message_id,
                failure_id=delivery.origin.failure_id,
                error_code=failure.code.value,
                attempt=step.state.history.attempts if step.state.history else None,
                decision=step.action,
                retry_in_seconds=delay.total_seconds() if delay else None,
                breaker=step.state.breaker,
                trace_id=trace_id_of(delivery.record, self._consumer),
            )
        return retry


def tier_of(delivery: Delivery) -> str:
    """Where an attempt happened: `blocking` (first delivery), a retry tier's delay, or `reprocess`."""
    if delivery.reprocess:
        return "reprocess"
    if delivery.in_tier:
        return delivery.record.topic.rsplit(".", 1)[-1]
    return "blocking"
