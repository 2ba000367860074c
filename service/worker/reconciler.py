"""The reconciler: one bounded pass for cron. It takes back expired effect leases, removes orphan retry rows,
resolves uncertain effects through the providers' look-ups, purges inbox (and published outbox) rows older
than the dedup window, and applies retention (service/store/retention.py).

Only one pass runs at a time: a PostgreSQL advisory lock; a second concurrent run returns at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import partial

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.codes import ErrorCode
from service.config import Topics
from service.metrics import Metrics
from service.policy import heartbeat
from service.policy.effects import EffectPolicy, Found, LookupFailed, LookupOutcome, Missing, after_lookup
from service.ports import EffectKind, EffectRegistry
from service.store import effects, inbox, outbox, processes, reconcile_runs, retention, retries
from service.store.effects import EffectRow
from service.store.retention import Retention
from service.store.uow import UnitOfWork, translated_errors
from service.tracing import Tracing, header
from service.worker.effects import record_outcomes

log = structlog.get_logger("reconciler")

_PURGE_BATCH = 1000
# A process not heard from for this long is no longer listed: its heartbeat row goes.
_PROCESSES_KEPT = timedelta(seconds=heartbeat.RETENTION_SECONDS)
# One batch of a purge: on this connection, rows past this period, at most this many; how many it removed.
Purge = Callable[[AsyncConnection, timedelta, int], Awaitable[int]]
_LOOKUP_BATCH = 100
# Look-ups of one kind that may fail in a row before a pass looks that kind's other uncertain effects up only after
# every other kind's: a provider that is down or slow must not spend the pass the other kinds and the purge need.
_FAILED_LOOKUPS_PER_KIND = 3
# A look-up's answer as its span's `outcome` says it.
_LOOKUP_OUTCOMES: dict[type, str] = {Found: "found", Missing: "missing", LookupFailed: "failed"}


@dataclass
class Summary:
    """What one pass did."""

    leases_expired: int = 0
    resolved_sent: int = 0
    sent_back_to_pending: int = 0
    failed: int = 0
    still_uncertain: int = 0
    inbox_purged: int = 0
    outbox_purged: int = 0
    retry_orphans_removed: int = 0
    # Retention: closed quarantined records' bytes removed, then the records (and their timeline events), audit
    # rows, reprocess and reconcile runs, ended console sessions.
    quarantine_payloads_erased: int = 0
    quarantine_purged: int = 0
    quarantine_events_purged: int = 0
    audit_purged: int = 0
    runs_purged: int = 0
    console_sessions_purged: int = 0
    processes_purged: int = 0
    seconds: float = 0.0
    complete: bool = True  # False when the time budget ended the pass early
    failing_kinds: list[str] = field(default_factory=list)  # kinds whose look-ups failed several times in a row

    def line(self) -> str:
        """The one-line summary printed for cron logs."""
        return (
            f"reconcile: {self.leases_expired} expired leases taken back; uncertain effects: "
            f"{self.resolved_sent} sent, {self.sent_back_to_pending} back to pending, {self.failed} failed, "
            f"{self.still_uncertain} still uncertain; purged {self.inbox_purged} inbox and {self.outbox_purged} "
            f"outbox rows; {self.retry_orphans_removed} orphan retry rows removed; retention: "
            f"{self.quarantine_payloads_erased} quarantine payloads erased, {self.quarantine_purged} quarantined "
            f"records ({self.quarantine_events_purged} events), {self.audit_purged} audit rows, {self.runs_purged} "
            f"runs, {self.console_sessions_purged} console sessions and {self.processes_purged} process heartbeats "
            f"purged; {self.seconds:.2f}s"
            + ("" if self.complete else " (time budget reached, run again)")
            + (f"; look-ups failing for {', '.join(sorted(self.failing_kinds))}" if self.failing_kinds else "")
        )


class Reconciler:
    """One pass; `run_once` returns None when another pass holds the lock."""

    def __init__(
        self,
        engine: AsyncEngine,
        kinds: EffectRegistry,
        policy: EffectPolicy,
        metrics: Metrics,
        *,
        topics: Topics,
        lease: timedelta,
        dedup_window: timedelta,
        retention: Retention,
        lookup_budget: float,
        program: str,
        consumer_name: str,
        tracing: Tracing | None = None,
    ) -> None:
        self._engine = engine
        self._tracing = tracing if tracing is not None and tracing.enabled else None  # the look-ups' spans
        self._kinds = kinds
        self._policy = policy
        self._metrics = metrics
        self._topics = topics
        self._lease = lease  # the effect lease: a kind's quiet time is told from it
        self._dedup_window = dedup_window  # inbox and published outbox rows older than this are purged
        self._retention = retention
        # One look-up's longest wait, as the effect worker allows a call (service/worker/effects.py, `call_budget`).
        self._lookup_budget = lookup_budget
        # The advisory lock's key: one pass at a time per service and consumer name.
        self._lock_key = f"{program}:reconcile:{consumer_name}"

    async def run_once(self, max_seconds: float) -> Summary | None:
        """Run one pass within `max_seconds`, or return None at once if another pass is running."""
        started = datetime.now(UTC)
        clock = time.monotonic()
        deadline = clock + max_seconds
        async with translated_errors(), self._engine.connect() as lock:
            # A session-level lock on a connection of its own: held for the pass, released even on a crash.
            key = self._lock_key
            got = await reconcile_runs.try_lock(lock, key)
            await lock.commit()
            if not got:
                return None
            try:
                summary = Summary()
                await self._expire(summary)
                await self._sweep(summary)
                await self._resolve(summary, deadline)
                await self._purge(summary, deadline)
                summary.seconds = time.monotonic() - clock
                await self._record(started, summary)
                return summary
            finally:
                await reconcile_runs.unlock(lock, key)
                await lock.commit()

    async def _expire(self, summary: Summary) -> None:
        async with UnitOfWork(self._engine) as uow:
            expired = await effects.expire_leases(uow.connection)
            await uow.commit()
        summary.leases_expired = len(expired)
        for key in expired:
            log.warning("effect_lease_expired", effect=key)

    async def _sweep(self, summary: Summary) -> None:
        """Remove retry rows whose record is terminal: they would hold its key for ever. The consumer removes
        them itself when a late tier copy arrives; this covers a copy that never comes (a crash, a purge)."""
        async with UnitOfWork(self._engine) as uow:
            orphans = await retries.sweep_orphans(uow.connection)
            await uow.commit()
        summary.retry_orphans_removed = len(orphans)
        for consumer, message_id in orphans:
            log.warning("retry_orphan_removed", consumer=consumer, message_id=message_id)

    async def _resolve(self, summary: Summary, deadline: float) -> None:
        async with UnitOfWork(self._engine) as uow:
            pending = await effects.uncertain(uow.connection, _LOOKUP_BATCH * 10, self._kinds.dependencies())
        # A kind whose look-ups fail in a row has its other effects looked up after every other kind's, once more up
        # to as many failures: its oldest effects may be the only ones its provider cannot answer for.
        later = await self._resolve_some(pending, summary, deadline)
        summary.still_uncertain += len(await self._resolve_some(later, summary, deadline))

    async def _resolve_some(self, pending: list[EffectRow], summary: Summary, deadline: float) -> list[EffectRow]:
        """Look these effects up and settle what the answers decide; return those left because their kind's
        look-ups kept failing."""
        failing: Counter[str] = Counter()  # per kind, look-ups that failed in a row
        left_over: list[EffectRow] = []
        for effect in pending:
            left = deadline - time.monotonic()
            if left <= 0:
                summary.complete = False
                summary.still_uncertain += 1
                continue
            if failing[effect.kind] >= _FAILED_LOOKUPS_PER_KIND:
                left_over.append(effect)
                continue
            kind = self._kinds.get(effect.kind)
            if kind is None or not kind.enabled:
                # Nobody to ask: left uncertain (visible in `effects list`), not counted as its provider failing.
                if kind is None:
                    log.warning("effect_kind_unknown", effect=effect.idempotency_key, kind=effect.kind)
                summary.still_uncertain += 1
                continue
            within = min(left, self._lookup_budget)
            if self._tracing is None or effect.trace_context is None:
                found = await self._look_up(kind, effect, within)
            else:
                found, effect = await self._traced(self._tracing, kind, effect, within)
            if isinstance(found, LookupFailed):
                failing[effect.kind] += 1
                if failing[effect.kind] == _FAILED_LOOKUPS_PER_KIND:
                    log.warning("effect_lookups_failing", kind=effect.kind, error_code=found.code.value)
                    if effect.kind not in summary.failing_kinds:
                        summary.failing_kinds.append(effect.kind)
            else:
                failing[effect.kind] = 0
            await self._apply(effect, found, summary)
        return left_over

    async def _apply(self, effect: EffectRow, found: LookupOutcome, summary: Summary) -> None:
        """Write what the look-up decides for the effect, and count it."""
        quiet = self._kinds.quiet_time(effect.kind, self._lease)
        decision = after_lookup(found, effect.reconcile_count, self._policy, quiet=quiet)
        if decision is None:
            summary.still_uncertain += 1
            return
        async with UnitOfWork(self._engine) as uow:
            kept = effect.idempotency_key in await record_outcomes(
                uow.connection, self._topics, self._kinds, [(effect, decision)], from_state="uncertain"
            )
            await uow.commit()
        if kept:
            self._metrics.effect(decision.state)
            if decision.state == "sent":
                summary.resolved_sent += 1
            elif decision.state == "pending":
                summary.sent_back_to_pending += 1
            else:
                summary.failed += 1
            log.info("effect_reconciled", effect=effect.idempotency_key, state=decision.state)

    async def _traced(
        self, tracing: Tracing, kind: EffectKind, effect: EffectRow, within: float
    ) -> tuple[LookupOutcome, EffectRow]:
        """`_look_up` in a span `look_up <kind>` (INTERNAL, as the effect worker's call: its HTTP requests are the
        CLIENT spans), the child of the attempt that wrote the effect; and the effect carrying that span's context,
        which what the answer settles (its events) continues."""
        attributes: dict[str, str | int] = {"effect.kind": effect.kind, "effect.attempt": effect.attempts}
        with tracing.continuing(f"look_up {effect.kind}", effect.trace_context, attributes) as span:
            found = await self._look_up(kind, effect, within)
            if span is None:
                return found, effect
            code = found.code.value if isinstance(found, LookupFailed) else None
            tracing.outcome(span, _LOOKUP_OUTCOMES[type(found)], code)
        return found, replace(effect, trace_context=header(span))

    async def _look_up(self, kind: EffectKind, effect: EffectRow, within: float) -> LookupOutcome:
        try:
            # The HTTP client's timeout restarts with every byte: an answer that drips would hold the pass, and the
            # lock every later pass needs, for as long as it drips.
            async with asyncio.timeout(within):
                return await kind.look_up(effect)
        except TimeoutError:
            return LookupFailed(ErrorCode.DOWNSTREAM_TIMEOUT)

    async def _purge(self, summary: Summary, deadline: float) -> None:
        """Delete expired rows in small batches, each its own short transaction (no long locks)."""
        kept = self._retention
        # Records past their whole period go before the bytes of the others: none is erased only to be deleted.
        purges: tuple[tuple[Purge, timedelta, str], ...] = (
            (inbox.purge, self._dedup_window, "inbox_purged"),
            (outbox.purge_published, self._dedup_window, "outbox_purged"),
            (partial(self._purge_quarantine, summary), kept.quarantine, "quarantine_purged"),
            (retention.purge_orphan_events, kept.quarantine, "quarantine_events_purged"),
            (retention.erase_closed_payloads, kept.quarantine_payload, "quarantine_payloads_erased"),
            (retention.purge_audit, kept.audit, "audit_purged"),
            (retention.purge_runs, kept.runs, "runs_purged"),
            (retention.purge_console_sessions, kept.console_sessions, "console_sessions_purged"),
            (processes.purge, _PROCESSES_KEPT, "processes_purged"),
        )
        for purge, period, counted in purges:
            while True:
                if time.monotonic() > deadline:
                    summary.complete = False
                    return
                async with UnitOfWork(self._engine) as uow:
                    deleted = await purge(uow.connection, period, _PURGE_BATCH)
                    await uow.commit()
                setattr(summary, counted, getattr(summary, counted) + deleted)
                if deleted < _PURGE_BATCH:
                    break

    @staticmethod
    async def _purge_quarantine(summary: Summary, connection: AsyncConnection, period: timedelta, batch: int) -> int:
        records, events = await retention.purge_closed_records(connection, period, batch)
        summary.quarantine_events_purged += events
        return records

    async def _record(self, started: datetime, summary: Summary) -> None:
        async with UnitOfWork(self._engine) as uow:
            outcome = "complete" if summary.complete else "partial"
            await reconcile_runs.record(uow.connection, started, datetime.now(UTC), outcome, asdict(summary))
            await uow.commit()
