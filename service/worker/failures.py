"""The shell of the next-step decision: what follows the failed attempts of a round, applied.

`next_step` (service/policy/next_step.py) decides for each failed delivery; this class keeps what the decision
reads across rounds (each downstream's run of consecutive transient failures), and does what a step needs
beyond its new retry state: the failure metric, the `record_failed` line, and for a pause its metric, its line
and its row in the pause log (the partition itself is paused by the consumer loop, from the lanes).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from service.domain.codes import FailureKind
from service.errors import InfrastructureUnavailable
from service.metrics import Metrics
from service.policy.backpressure import BackpressurePolicy, run_after_round
from service.policy.classify import Failure
from service.policy.delivery import Delivery, RetryState
from service.policy.next_step import Budgets, Pause, Quarantine, RetryInPlace, ToTier, next_step
from service.policy.round import Round
from service.store import parking
from service.store.uow import UnitOfWork

log = structlog.get_logger("order_service.processor")


class Failures:
    """Decides and applies the next steps of a consumer's failed deliveries."""

    def __init__(
        self,
        engine: AsyncEngine,
        consumer: str,
        budgets: Budgets,
        backpressure: BackpressurePolicy,
        metrics: Metrics,
        clock: Callable[[], datetime],
        rng: random.Random,
    ) -> None:
        self._engine = engine
        self._consumer = consumer
        self._budgets = budgets
        self._backpressure = backpressure
        self._metrics = metrics
        self._clock = clock
        self._rng = rng
        self._failing: dict[str, int] = defaultdict(int)  # consecutive transient failures per downstream

    def succeeded(self, downstream: str) -> None:
        """A call to the downstream succeeded: its run of failures ends."""
        self._failing[downstream] = 0

    async def decide(self, round_: Round, failures: dict[Delivery, Failure]) -> dict[Delivery, RetryState]:
        """The next step of each failed delivery of the round, applied; return their new retry states."""
        if not failures:
            return {}
        now = self._clock()
        loop_now = asyncio.get_running_loop().time()
        failed_on = Counter(
            f.downstream for f in failures.values() if f.downstream and f.code.kind is FailureKind.TRANSIENT
        )
        for downstream, count in failed_on.items():
            self._failing[downstream] = run_after_round(self._failing[downstream], count, self._backpressure)
        retry: dict[Delivery, RetryState] = {}
        for delivery, state in round_.due.items():
            failure = failures.get(delivery)
            if failure is None:
                continue
            self._metrics.failure(failure.code.value, tier_of(delivery))
            step = next_step(
                delivery,
                state,
                failure,
                budgets=self._budgets,
                backpressure=self._backpressure,
                failing=self._failing[failure.downstream or ""],
                now=now,
                loop_now=loop_now,
                rng=self._rng,
            )
            retry[delivery] = step.state
            if isinstance(step, Pause):
                await self._log_pause(delivery, failure, step.duration)
                continue
            delay = step.delay if isinstance(step, RetryInPlace | ToTier | Quarantine) else None
            log.info(
                "record_failed",
                message_id=delivery.message_id,
                failure_id=delivery.origin.failure_id,
                error_code=failure.code.value,
                attempt=step.state.history.attempts if step.state.history else None,
                decision=step.action,
                retry_in_seconds=delay.total_seconds() if delay else None,
                trace_id=delivery.record.trace_id,
            )
        return retry

    async def _log_pause(self, delivery: Delivery, failure: Failure, pause: timedelta) -> None:
        self._metrics.pause(failure.downstream or "unknown")
        record = delivery.record
        log.warning(
            "backpressure_pause",
            topic=record.topic,
            partition=record.partition,
            downstream=failure.downstream,
            error_code=failure.code.value,
            pause_seconds=pause.total_seconds(),
            message_id=delivery.message_id,
        )
        try:
            async with UnitOfWork(self._engine) as uow:
                await parking.log_pause(
                    uow.connection,
                    self._consumer,
                    record.topic,
                    record.partition,
                    failure.downstream,
                    failure.code.value,
                    pause.total_seconds(),
                )
                await uow.commit()
        except InfrastructureUnavailable:
            log.warning("database_unavailable", what="pause log")


def tier_of(delivery: Delivery) -> str:
    """Where an attempt happened: `blocking` (first delivery), a retry tier's delay, or `reprocess`."""
    if delivery.reprocess:
        return "reprocess"
    if delivery.in_tier:
        return delivery.record.topic.rsplit(".", 1)[-1]
    return "blocking"
