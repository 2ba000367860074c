"""Retention (docs/runbook.md, Retention and erasure): what the reconciler removes once its period has passed, one
bounded batch per call, each its own short transaction. Open quarantined records are never touched; a closed one
(resolved or reprocessed) first loses its original bytes and header values, later its row and its timeline."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

CLOSED = ("resolved", "reprocessed")  # the statuses retention may act on
RETENTION_ACTOR = "retention"  # who `erased_by` names when the payload period, not an operator, removed the bytes

# The audit tables refuse every DELETE but this transaction's (migration 0017).
_ALLOW_PURGE = text("SELECT set_config('core.retention_purge', 'on', true)")


def names_only(column: str) -> str:
    """SQL for a header list (`[[name, value], …]`) that keeps its names (facts) and drops their values."""
    return (
        f"(SELECT coalesce(jsonb_agg(jsonb_build_array(h->0, '')), '[]'::jsonb) FROM jsonb_array_elements({column}) h)"
    )


# A record's header names stay (facts); their values go with the bytes.
HEADER_NAMES_ONLY = names_only("source_headers")


def scrub_copies(erased: str) -> str:
    """A CTE body that removes the copies of the records in CTE `erased` from the outbox (a reprocess run's or an
    edit's, which carry the record's bytes and its `failure-id` and `consumer` headers): one not yet published is
    never sent; one published keeps no bytes and no header value."""
    return f"""
        UPDATE outbox o
        SET payload = ''::bytea, headers = {names_only("o.headers")},
            published_at = COALESCE(o.published_at, now())
        FROM {erased}
        WHERE o.headers @> jsonb_build_array(jsonb_build_array('failure-id', {erased}.failure_id))
          AND o.headers @> jsonb_build_array(jsonb_build_array('consumer', {erased}.consumer_name))
        RETURNING 1
    """


def scrub_edits(erased: str, actor: str = ":actor") -> str:
    """A CTE body that removes the bytes and header values the edits of the records in CTE `erased` hold (their
    diffs too, which quote them), and turns an edit still waiting for approval down: nothing is left to send."""
    return f"""
        UPDATE quarantine_edits e
        SET payload_before = NULL, payload_after = ''::bytea, diff = '(erased)',
            headers_before = {names_only("e.headers_before")}, headers_after = {names_only("e.headers_after")},
            state = CASE WHEN e.state = 'pending_approval' THEN 'rejected' ELSE e.state END,
            decided_by = CASE WHEN e.state = 'pending_approval' THEN {actor} ELSE e.decided_by END,
            decided_at = CASE WHEN e.state = 'pending_approval' THEN now() ELSE e.decided_at END
        FROM {erased} WHERE e.consumer_name = {erased}.consumer_name AND e.failure_id = {erased}.failure_id
        RETURNING 1
    """


def erase_records(selected: str, *, copies: bool = True) -> str:
    """The one statement that erases records: `selected` picks them (a FROM item giving consumer_name and
    failure_id, locked); their bytes and header values go, they are marked erased by `:actor` with an event in
    their timelines, and their edits lose what they hold (`scrub_edits`), their copies in the outbox too with
    `copies` (`scrub_copies`: an operator's erase; retention's needs not, the outbox's published rows are gone
    after the dedup window, long before a closed record's payload period, and its join would scan the outbox for
    each of a thousand records). It returns the failure ids erased."""
    scrubbed = f""", copies AS ({scrub_copies("erased")})""" if copies else ""
    return f"""
    WITH erased AS (
        UPDATE quarantine q SET payload = NULL, source_headers = {HEADER_NAMES_ONLY}, erased_at = now(),
                                erased_by = :actor
        FROM ({selected}) AS due
        WHERE q.consumer_name = due.consumer_name AND q.failure_id = due.failure_id AND q.erased_at IS NULL
        RETURNING q.consumer_name, q.failure_id
    ), events AS (
        INSERT INTO quarantine_events (consumer_name, failure_id, at, event, actor, detail)
        SELECT consumer_name, failure_id, now(), 'erased', :actor, 'payload and header values removed' FROM erased
    ), edits AS ({scrub_edits("erased")}
    ){scrubbed}
    SELECT failure_id FROM erased
    """


_ERASE_CLOSED_PAYLOADS = text(
    erase_records(
        """SELECT consumer_name, failure_id FROM quarantine
           WHERE status IN ('resolved', 'reprocessed') AND erased_at IS NULL
             AND updated_at < now() - CAST(:period AS interval)
           LIMIT :batch FOR UPDATE SKIP LOCKED""",
        copies=False,
    )
)
_PURGE_CLOSED_RECORDS = text(
    """
    WITH gone AS (
        DELETE FROM quarantine q
        USING (SELECT consumer_name, failure_id FROM quarantine
               WHERE status IN ('resolved', 'reprocessed') AND updated_at < now() - CAST(:period AS interval)
               LIMIT :batch FOR UPDATE SKIP LOCKED) AS due
        WHERE q.consumer_name = due.consumer_name AND q.failure_id = due.failure_id
        RETURNING q.consumer_name, q.failure_id
    ), events AS (
        DELETE FROM quarantine_events e USING gone
        WHERE e.consumer_name = gone.consumer_name AND e.failure_id = gone.failure_id RETURNING 1
    ), notes AS (
        DELETE FROM quarantine_annotations a USING gone
        WHERE a.consumer_name = gone.consumer_name AND a.failure_id = gone.failure_id RETURNING 1
    ), edits AS (
        DELETE FROM quarantine_edits d USING gone
        WHERE d.consumer_name = gone.consumer_name AND d.failure_id = gone.failure_id RETURNING 1
    )
    SELECT (SELECT count(*) FROM gone) AS records, (SELECT count(*) FROM events) AS events,
           (SELECT count(*) FROM notes) AS notes
    """
)
# A record's attempts reach its timeline as they happen (a hand-off to a retry tier is a `failed` event, migration
# 0020), before it is known whether the record will ever be quarantined: events of records with no quarantine row
# are removed once they are as old as a closed record's period.
_PURGE_ORPHAN_EVENTS = text(
    """
    DELETE FROM quarantine_events WHERE id IN (
        SELECT e.id FROM quarantine_events e
        WHERE e.event = 'failed' AND e.at < now() - CAST(:period AS interval)
          AND NOT EXISTS (SELECT 1 FROM quarantine q
                          WHERE q.consumer_name = e.consumer_name AND q.failure_id = e.failure_id)
        ORDER BY e.id LIMIT :batch)
    """
)
_PURGE_AUDIT = text(
    """
    DELETE FROM audit_log WHERE id IN (
        SELECT id FROM audit_log WHERE at < now() - CAST(:period AS interval) ORDER BY id LIMIT :batch)
    """
)
_PURGE_REPROCESS_RUNS = text(
    """
    WITH due AS (
        SELECT id FROM reprocess_runs
        WHERE finished_at < now() - CAST(:period AS interval) ORDER BY finished_at LIMIT :batch
    ), items AS (
        DELETE FROM reprocess_items i USING due WHERE i.run_id = due.id
    ), runs AS (
        DELETE FROM reprocess_runs r USING due WHERE r.id = due.id RETURNING 1
    )
    SELECT count(*) FROM runs
    """
)
_PURGE_RECONCILE_RUNS = text(
    """
    DELETE FROM reconcile_runs WHERE id IN (
        SELECT id FROM reconcile_runs WHERE finished_at < now() - CAST(:period AS interval) ORDER BY id LIMIT :batch)
    """
)
# A session has ended at its revocation or its expiry, whichever came first.
_PURGE_SESSIONS = text(
    """
    DELETE FROM console_sessions WHERE id_hash IN (
        SELECT id_hash FROM console_sessions
        WHERE LEAST(expires_at, COALESCE(revoked_at, expires_at)) < now() - CAST(:period AS interval) LIMIT :batch)
    """
)


class _Periods(Protocol):
    retention_quarantine_payload: timedelta
    retention_quarantine: timedelta
    retention_audit: timedelta
    retention_runs: timedelta
    retention_console_sessions: timedelta


@dataclass(frozen=True)
class Retention:
    """How long each kind of row is kept (the `*_RETENTION_*` settings)."""

    quarantine_payload: timedelta
    quarantine: timedelta
    audit: timedelta
    runs: timedelta
    console_sessions: timedelta

    @classmethod
    def of(cls, settings: _Periods) -> Retention:
        """The periods the settings name."""
        return cls(
            settings.retention_quarantine_payload,
            settings.retention_quarantine,
            settings.retention_audit,
            settings.retention_runs,
            settings.retention_console_sessions,
        )


async def erase_closed_payloads(connection: AsyncConnection, period: timedelta, batch: int) -> int:
    """Remove the bytes and header values of up to `batch` records closed longer than `period` ago; how many."""
    params = {"period": period, "batch": batch, "actor": RETENTION_ACTOR}
    return len((await connection.execute(_ERASE_CLOSED_PAYLOADS, params)).all())


async def purge_closed_records(connection: AsyncConnection, period: timedelta, batch: int) -> tuple[int, int]:
    """Delete up to `batch` records closed longer than `period` ago, with their timelines, notes and edits; how
    many records, and how many timeline events."""
    await connection.execute(_ALLOW_PURGE)
    row = (await connection.execute(_PURGE_CLOSED_RECORDS, {"period": period, "batch": batch})).one()
    return int(row.records), int(row.events)


async def purge_orphan_events(connection: AsyncConnection, period: timedelta, batch: int) -> int:
    """Delete up to `batch` timeline events older than `period` of records that were never quarantined (a record's
    hand-offs to the retry tiers, migration 0020, when it then succeeded); how many."""
    await connection.execute(_ALLOW_PURGE)
    return (await connection.execute(_PURGE_ORPHAN_EVENTS, {"period": period, "batch": batch})).rowcount


async def purge_audit(connection: AsyncConnection, period: timedelta, batch: int) -> int:
    """Delete up to `batch` audit rows older than `period`; how many."""
    await connection.execute(_ALLOW_PURGE)
    return (await connection.execute(_PURGE_AUDIT, {"period": period, "batch": batch})).rowcount


async def purge_runs(connection: AsyncConnection, period: timedelta, batch: int) -> int:
    """Delete up to `batch` reprocess runs (with their items) and `batch` reconcile passes finished longer than
    `period` ago; how many runs and passes."""
    params = {"period": period, "batch": batch}
    reprocess = int((await connection.execute(_PURGE_REPROCESS_RUNS, params)).scalar_one())
    return reprocess + (await connection.execute(_PURGE_RECONCILE_RUNS, params)).rowcount


async def purge_console_sessions(connection: AsyncConnection, period: timedelta, batch: int) -> int:
    """Delete up to `batch` console sessions that ended longer than `period` ago; how many."""
    return (await connection.execute(_PURGE_SESSIONS, {"period": period, "batch": batch})).rowcount
