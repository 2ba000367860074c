"""Prometheus metrics of one process, in a registry of its own (built by the container, not at import)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    """The process's counters and gauges; names are part of the contract with dashboards and alerts.

    Counters count what this process did. Gauges that describe shared state (quarantine, outbox, effects,
    parked keys, reconciler runs) are read from PostgreSQL by `GaugeRefresher`, at most every 10 s.
    """

    def __init__(self, prefix: str) -> None:
        self.registry = CollectorRegistry()
        r, p = self.registry, prefix
        self.records = Counter(f"{p}_records", "Records by outcome.", ["outcome"], registry=r)
        self.failures = Counter(
            f"{p}_failures", "Failed attempts, rejections and quarantines, by error code.", ["error_code"], registry=r
        )
        self.quarantined = Counter(
            f"{p}_quarantined", "Records quarantined by this process, by error code.", ["error_code"], registry=r
        )
        self.attempts = Counter(
            f"{p}_retry_attempts",
            "Failed attempts by where they happened: blocking, a retry tier (its delay), or reprocess.",
            ["tier"],
            registry=r,
        )
        self.published = Counter(f"{p}_outbox_published", "Outbox rows published by the relay.", registry=r)
        self.batch_seconds = Histogram(
            f"{p}_processing_duration_seconds",
            "Time to take one round of records to their next state (one transaction).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.breaker_state = Gauge(
            f"{p}_breaker_state",
            "Each downstream's circuit breaker in this process: 0 closed, 1 half-open (a probe is out), 2 open.",
            ["downstream"],
            registry=r,
        )
        self.breaker_open_seconds = Gauge(
            f"{p}_breaker_open_seconds",
            "How long each downstream's breaker has been open or half-open without closing (0 when closed).",
            ["downstream"],
            registry=r,
        )
        self.breaker_transitions = Counter(
            f"{p}_breaker_transitions",
            "Circuit breaker transitions, by downstream and the state moved to.",
            ["downstream", "state"],
            registry=r,
        )
        self.downstream_misconfigured = Gauge(
            f"{p}_downstream_misconfigured",
            "1 while a downstream's breaker is open because it answered what its API never answers (our URL or "
            "credentials).",
            ["downstream"],
            registry=r,
        )
        self.breaker_alert_after = Gauge(
            f"{p}_breaker_alert_after_seconds",
            "The breaker alert-after setting: how long a breaker may stay open before the alert fires.",
            registry=r,
        )
        self.effect_outcomes = Counter(
            f"{p}_effect_outcomes",
            "Effect calls and look-ups, by the state the effect moved to.",
            ["state"],
            registry=r,
        )
        self.effect_errors = Counter(
            f"{p}_effect_errors",
            "Effect calls and look-ups that did not succeed, by error code.",
            ["error_code"],
            registry=r,
        )
        self.consumer_lag = Gauge(
            f"{p}_consumer_lag", "Records not yet committed, per partition.", ["topic", "partition"], registry=r
        )
        self.quarantine_open = Gauge(
            f"{p}_quarantine_open", "Open quarantine records.", ["error_code", "owner"], registry=r
        )
        self.quarantine_oldest = Gauge(
            f"{p}_quarantine_oldest_age_seconds", "Age of the oldest unresolved quarantine record.", registry=r
        )
        self.outbox_pending = Gauge(f"{p}_outbox_pending", "Outbox rows not yet published.", registry=r)
        self.outbox_set_aside = Gauge(
            f"{p}_outbox_set_aside", "Outbox rows Kafka refused for their content, set aside.", registry=r
        )
        self.outbox_oldest = Gauge(
            f"{p}_outbox_oldest_age_seconds", "Age of the oldest unpublished outbox row.", registry=r
        )
        self.effects = Gauge(f"{p}_effects", "Effects by state.", ["state"], registry=r)
        self.uncertain_oldest = Gauge(
            f"{p}_effects_uncertain_oldest_age_seconds", "Age of the oldest uncertain effect.", registry=r
        )
        self.parked_keys = Gauge(f"{p}_parked_keys", "Keys held with parked records or a block.", registry=r)
        self.parked_records = Gauge(f"{p}_parked_records", "Records parked behind a held key.", registry=r)
        self.retrying = Gauge(f"{p}_retrying_records", "Records waiting in a retry tier.", registry=r)
        self.reconcile_runs = Gauge(
            f"{p}_reconcile_runs", "Reconciler passes recorded, by outcome.", ["outcome"], registry=r
        )
        self.reconcile_last = Gauge(
            f"{p}_reconcile_last_run_timestamp_seconds", "When the last reconciler pass finished.", registry=r
        )
        self.reprocess_items = Gauge(
            f"{p}_reprocess_items", "Reprocessed items by verified outcome (all runs).", ["outcome"], registry=r
        )

    def round_took(self, seconds: float, trace_id: str | None) -> None:
        """A round's duration, with its trace id as the exemplar when one of its records is sampled (seen in the
        OpenMetrics exposition only)."""
        self.batch_seconds.observe(seconds, {"trace_id": trace_id} if trace_id is not None else None)

    def effect(self, state: str, error_code: str | None = None, count: int = 1) -> None:
        """Count `count` effect outcomes by the state they moved to, and by their code when they did not succeed."""
        self.effect_outcomes.labels(state=state).inc(count)
        if error_code is not None:
            self.effect_errors.labels(error_code=error_code).inc(count)

    def record(self, outcome: str, error_code: str | None, count: int = 1) -> None:
        """Count `count` records of one outcome; rejections and quarantines also count under their code."""
        self.records.labels(outcome=outcome).inc(count)
        if error_code is not None and outcome in ("rejected", "quarantined"):
            self.failures.labels(error_code=error_code).inc(count)
        if outcome == "quarantined" and error_code is not None:
            self.quarantined.labels(error_code=error_code).inc(count)

    def failure(self, error_code: str, tier: str) -> None:
        """Count one failed attempt, and where it happened."""
        self.failures.labels(error_code=error_code).inc()
        self.attempts.labels(tier=tier).inc()
