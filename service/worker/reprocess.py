"""Controlled reprocessing: a quarantined record goes back only through an audited, rate-limited run.

A run acts as the one consumer name the records were quarantined under. It selects records, skips those whose
stored bytes no longer decode, optionally tries a deterministic sample first, publishes through the outbox to
`<source>.reprocess` at a bounded rate (keeping the original message id and key, and naming the consumer in the
`consumer` header, so that another consumer name reading the topic passes over the copy), and verifies each item
by its business state — inbox status, quarantine status and the order's effects — never by Kafka delivery. It
stops, with the reason, when too many items fail again, when an item that was already applied gains an effect (an
unexpected duplicate), or when the consumer falls behind. A ramped run (`Options.ramp`) sends the records in the
growing batches of service/policy/ramp.py, each once the one before is verified, and stops on the first failure.

An item is sent in one transaction that locks its quarantine row and finds it as it was when the run selected it
(or when an operator saw it, `Selection.seen`); a record resolved or otherwise changed meanwhile is not sent but
`skipped`, with the reason, so that a run never acts on a record an operator has since decided about.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import structlog
from aiolimiter import AsyncLimiter
from sqlalchemy.ext.asyncio import AsyncEngine

from service.explain import Names, explain
from service.policy import ramp
from service.policy.handling import DecodeFailure
from service.policy.verification import judge
from service.stopping import sleep_unless_stopped
from service.store import erasure, outbox, quarantine
from service.store import reprocess as store
from service.store.reprocess import Candidate, ItemState
from service.store.uow import UnitOfWork
from service.worker.reprocess_run import Options, Progress, Report, Selection

log = structlog.get_logger("reprocess")

_MIN_JUDGED = 5


@dataclass
class _Item:
    candidate: Candidate
    stage: str
    attempt: int = 0
    before: ItemState | None = None
    outbox_id: int | None = None
    published_at: float | None = None
    outcome: str | None = None
    detail: str = ""


class Reprocessor:
    """Runs one reprocess workflow."""

    def __init__(
        self,
        engine: AsyncEngine,
        lag: Callable[[], Awaitable[int]],
        decode: Callable[[bytes | None], Any],
        *,
        consumer_name: str,
        topic: str,
        names: Names,
    ) -> None:
        self._engine = engine
        self._decode = decode  # the domain's (Handler.decode): a stored payload that no longer decodes is skipped
        self._lag = lag
        self._consumer = consumer_name
        self._topic = topic  # the reprocess topic the copies go to
        self._names = names  # the settings' class: the variables a failed run's reason names

    async def run(
        self, selection: Selection, options: Options, progress: Progress, confirm: Callable[[str], bool]
    ) -> Report:
        """Select, check, (sample,) publish, verify; every step is audited unless it is a dry run."""
        async with UnitOfWork(self._engine) as uow:
            candidates = await store.select_candidates(
                uow.connection,
                failure_ids=selection.failure_ids,
                error_code=selection.error_code,
                since=selection.since,
                until=selection.until,
                consumer=self._consumer,
                owner=selection.owner,
            )
        seen = dict(selection.seen)
        # What the operator saw is what the run holds each record to (it was selected then, by them).
        candidates = [dataclasses.replace(c, status=seen.get(c.failure_id, c.status)) for c in candidates]
        report = Report(
            run_id=None,
            selected=len(candidates),
            statuses={c.failure_id: c.status for c in candidates},
        )
        usable = []
        for candidate in candidates:
            # Each record in exactly one list: refused as erased, sent (`selection`), or skipped as undecodable.
            if candidate.erased is not None:
                report.erased[candidate.failure_id] = candidate.erased
            elif isinstance(self._decode(candidate.payload), DecodeFailure):
                report.undecodable.append(candidate.failure_id)
            else:
                usable.append(candidate)
                report.selection.append(candidate.failure_id)
        if options.dry_run:
            report.outcome = "dry_run"
            return report
        report.run_id = f"rp-{uuid.uuid4().hex[:12]}"
        async with UnitOfWork(self._engine) as uow:
            await store.start_run(
                uow.connection,
                report.run_id,
                actor=options.actor,
                reason=options.reason,
                selection={
                    **asdict(selection),
                    "since": _iso(selection.since),
                    "until": _iso(selection.until),
                    "consumer": self._consumer,
                },
                options={k: v for k, v in asdict(options).items() if k not in {"reason", "actor"}},
            )
            await uow.commit()
        progress.opened(report.run_id)
        try:
            await self._stages(report, usable, options, progress, confirm)
        except Exception as error:
            # The run cannot go on (the broker or the database went away mid-run): its audit row says so, with
            # the reason in one line, instead of staying `running`; the error still ends the command.
            report.outcome, report.stop_reason = "failed", explain(error, self._names)
            await self._finish(report)
            raise
        await self._finish(report)
        return report

    async def _stages(
        self, report: Report, usable: list[Any], options: Options, progress: Progress, confirm: Callable[[str], bool]
    ) -> None:
        if options.ramp:
            await self._ramp(report, usable, options, progress)
            return
        sample, rest = _split(usable, options.sample)
        stages = [("sample", sample), ("main", rest)] if sample else [("main", rest)]
        for stage, candidates in stages:
            if not candidates:
                continue
            reason = await self._stage(report, [_Item(one, stage) for one in candidates], options, progress)
            if reason is not None:
                report.outcome, report.stop_reason = "stopped", reason
                return
            if stage == "sample" and rest:
                skipped = f", {report.skipped} skipped (changed since selected)" if report.skipped else ""
                question = (
                    f"sample of {len(sample)}: {report.reprocessed} reprocessed, {report.noop} already applied, "
                    f"{report.failed_again} failed again{skipped}. Reprocess the remaining {len(rest)}?"
                )
                if not confirm(question):
                    report.outcome, report.stop_reason = "stopped", "not confirmed after the sample"
                    return

    async def _ramp(self, report: Report, usable: list[Candidate], options: Options, progress: Progress) -> None:
        """Send the selection in the ramp's batches, each once the one before is verified; stop on a failure."""
        batches = ramp.plan(len(usable))
        settled: list[list[ramp.Settled]] = []
        stopped: str | None = None
        while isinstance(step := ramp.next_step(batches, settled, stopped), ramp.Batch):
            items = [_Item(one, step.stage) for one in usable[step.start : step.start + step.size]]
            stopped = await self._stage(report, items, options, progress)
            settled.append(
                [ramp.Settled(i.candidate.failure_id, i.outcome, i.detail) for i in items if i.outcome is not None]
            )
        if isinstance(step, ramp.Stop):
            report.outcome, report.stop_reason = "stopped", step.reason

    async def _finish(self, report: Report) -> None:
        assert report.run_id is not None
        async with UnitOfWork(self._engine) as uow:
            await store.finish_run(uow.connection, report.run_id, report.outcome, report.stop_reason, report.counts())
            await uow.commit()
        log.info("reprocess_finished", run_id=report.run_id, outcome=report.outcome, stop_reason=report.stop_reason)

    async def _stage(self, report: Report, items: list[_Item], options: Options, progress: Progress) -> str | None:
        """Publish and verify one stage (or a ramp's batch) until each item is verified or the verification times
        out; return a stop reason, or None."""
        assert report.run_id is not None
        # A token bucket of one token every 1/rate seconds: a steady rate, no initial burst.
        limiter = AsyncLimiter(1, 1 / options.rate)
        progress.start(items[0].stage, len(items))
        try:
            for item in items:
                await limiter.acquire()
                if (lag := await self._lag()) > options.max_lag:
                    return f"consumer lag {lag} is over the threshold {options.max_lag}"
                if not await self._publish(report.run_id, item):
                    report.skipped += 1
                    progress.advance(report.published, _verified(items))
                    continue
                report.published += 1
                reason = await self._verify(report, items, options, final=False)
                progress.advance(report.published, _verified(items))
                if reason is not None:
                    return reason
            deadline = time.monotonic() + options.verify_timeout
            while any(item.outcome is None for item in items) and time.monotonic() < deadline:
                reason = await self._verify(report, items, options, final=False)
                progress.advance(report.published, _verified(items))
                if reason is not None:
                    return reason
                await sleep_unless_stopped(asyncio.Event(), 0.2)
            return await self._verify(report, items, options, final=True)
        finally:
            progress.finish()

    async def _publish(self, run_id: str, item: _Item) -> bool:
        """Send one item, unless its record changed since it was selected: then record it `skipped` (False)."""
        candidate = item.candidate
        async with UnitOfWork(self._engine) as uow:
            c = uow.connection
            # Locked until the copy's outbox row commits: a resolve waits for this send, or this send sees it.
            status = await quarantine.lock_status(c, candidate.record)
            if status is not None and await erasure.is_erased(c, candidate.record):
                status = "erased"  # since it was selected: the bytes this run holds must not be sent
            item.attempt = await store.attempts_so_far(c, candidate.record) + 1
            if status != candidate.status:
                item.outcome = "skipped"
                item.detail = detail = f"not sent: {status or 'gone'} now, {candidate.status} when selected"
                await store.add_item(
                    c,
                    run_id=run_id,
                    record=candidate.record,
                    message_id=candidate.message_id,
                    stage=item.stage,
                    attempt=item.attempt,
                    outcome="skipped",
                    published_at=None,
                    detail=detail,
                )
                await uow.commit()
                log.info("reprocess_item_skipped", run_id=run_id, failure_id=candidate.failure_id, status=status)
                return False
            item.before = await store.state_of(c, candidate)
            copy = store.copy_of(candidate, self._topic, sender=("reprocess-run-id", run_id), attempt=item.attempt)
            [item.outbox_id] = await outbox.add(c, [copy])
            await store.add_item(
                c,
                run_id=run_id,
                record=candidate.record,
                message_id=candidate.message_id,
                stage=item.stage,
                attempt=item.attempt,
                outcome="published",
                published_at=datetime.now().astimezone(),
            )
            await uow.commit()
        item.published_at = time.monotonic()
        return True

    async def _verify(self, report: Report, items: list[_Item], options: Options, *, final: bool) -> str | None:
        """Look at the business state of published items; decide those that are done; return a stop reason."""
        open_items = [item for item in items if item.published_at is not None and item.outcome is None]
        if not open_items:
            return None
        assert report.run_id is not None
        async with UnitOfWork(self._engine) as uow:
            c = uow.connection
            # A copy counts as read only once the relay has published it (the lag is measured after that: a
            # copy still in the outbox is not in Kafka's end offsets, and a no-op would be judged unseen).
            waiting = await outbox.unpublished(c, [item.outbox_id for item in open_items if item.outbox_id is not None])
            caught_up = await self._lag() == 0
            for item in open_items:
                after = await store.state_of(c, item.candidate)
                assert item.before is not None
                outcome, detail = judge(item.before, after, caught_up and item.outbox_id not in waiting)
                if outcome is None and final:
                    outcome, detail = "unverified", "no business change seen before the verification timeout"
                if outcome is None:
                    continue
                item.outcome, item.detail = outcome, detail
                await store.settle_item(c, report.run_id, item.candidate.failure_id, outcome, detail)
                self._count(report, outcome)
                if outcome == "unexpected_duplicate":
                    await uow.commit()
                    return f"unexpected duplicate: {item.candidate.failure_id} ({detail})"
            await uow.commit()
        verified = report.reprocessed + report.failed_again + report.noop
        # Judge the rate on enough items: a whole stage, or at least five (one early failure is not a trend).
        enough = final or _verified(items) >= min(_MIN_JUDGED, len(items))
        if enough and verified and report.failed_again / verified > options.max_failure_rate:
            rate = report.failed_again / verified
            return f"failure rate {rate:.0%} is over the threshold {options.max_failure_rate:.0%}"
        return None

    def _count(self, report: Report, outcome: str) -> None:
        if outcome == "reprocessed":
            report.reprocessed += 1
        elif outcome == "failed_again":
            report.failed_again += 1
        elif outcome == "noop":
            report.noop += 1
        elif outcome == "unverified":
            report.unverified += 1


def _verified(items: list[_Item]) -> int:
    return sum(item.outcome is not None for item in items)


def _split(items: list[Candidate], sample: int | None) -> tuple[list[Candidate], list[Candidate]]:
    """A deterministic sample: the same selection always gives the same sample (ordered by a hash)."""
    if not sample:
        return [], items
    ranked = sorted(items, key=lambda c: hashlib.sha256(c.failure_id.encode()).hexdigest())
    chosen = {c.failure_id for c in ranked[:sample]}
    return [c for c in items if c.failure_id in chosen], [c for c in items if c.failure_id not in chosen]


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None
