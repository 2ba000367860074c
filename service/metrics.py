"""Prometheus metrics of one process, in a registry of its own (built by the container, not at import)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    """The process's counters and gauges; names are part of the contract with dashboards and alerts."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.records = Counter(
            "orders_records",
            "Records that reached a terminal state, by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        self.failures = Counter(
            "orders_failures",
            "Failed attempts and terminal failures, by error code.",
            ["error_code"],
            registry=self.registry,
        )
        self.published = Counter(
            "orders_outbox_published", "Outbox rows published by the relay.", registry=self.registry
        )
        self.batch_seconds = Histogram(
            "orders_batch_duration_seconds",
            "Time to take one fetched batch to terminal states.",
            registry=self.registry,
        )
        self.pauses = Counter(
            "orders_backpressure_pauses",
            "Times fetching a partition was paused because a downstream asked to slow down.",
            ["downstream"],
            registry=self.registry,
        )
        self.effect_outcomes = Counter(
            "orders_effect_outcomes",
            "Effect attempts and look-ups, by the state the effect moved to.",
            ["state"],
            registry=self.registry,
        )
        self.reprocess_items = Counter(
            "orders_reprocess_items",
            "Reprocessed items by verified outcome (reprocessed, failed_again, noop, unverified).",
            ["outcome"],
            registry=self.registry,
        )
        self.outbox_pending = Gauge("orders_outbox_pending", "Outbox rows not yet published.", registry=self.registry)

    def pause(self, downstream: str) -> None:
        """Count one backpressure pause."""
        self.pauses.labels(downstream=downstream).inc()

    def reprocess(self, outcome: str) -> None:
        """Count one verified reprocess item by outcome."""
        self.reprocess_items.labels(outcome=outcome).inc()

    def effect(self, state: str) -> None:
        """Count one effect outcome by the state it moved to."""
        self.effect_outcomes.labels(state=state).inc()

    def record(self, outcome: str, error_code: str | None) -> None:
        """Count one terminal record; quarantines and rejections also count under their code."""
        self.records.labels(outcome=outcome).inc()
        if error_code is not None:
            self.failures.labels(error_code=error_code).inc()

    def failure(self, error_code: str) -> None:
        """Count one failed attempt."""
        self.failures.labels(error_code=error_code).inc()
