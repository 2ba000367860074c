"""The core's tables of contract §7 as SQLAlchemy Core metadata; a domain adds its aggregates' tables to the same
`metadata` (through `service.ports`). `tests/integration/test_migrations.py` keeps the Alembic history equal to
both."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

metadata = MetaData(
    naming_convention={
        "pk": "pk_%(table_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    }
)


inbox = Table(
    "inbox",
    metadata,
    Column("consumer_name", Text, nullable=False),
    Column("message_id", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("source_topic", Text, nullable=False),
    Column("source_partition", Integer, nullable=False),
    Column("source_offset", BigInteger, nullable=False),
    Column("aggregate_id", Text),
    Column("error_code", Text),
    Column("received_at", DateTime(timezone=True), nullable=False),
    Column("processed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # The unique key that turns a redelivery into a no-op (contract §7).
    PrimaryKeyConstraint("consumer_name", "message_id"),
    CheckConstraint("status IN ('processed', 'rejected', 'quarantined')", name="status"),
    Index("ix_inbox_processed_at", "processed_at"),
)

outbox = Table(
    "outbox",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("topic", Text, nullable=False),
    Column("key", Text),
    Column("headers", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("payload", LargeBinary, nullable=False),
    # A copy's original Kafka key (pack_key), published byte-exact; NULL: publish `key`, the ordering key.
    Column("kafka_key", LargeBinary),
    # The span context (`traceparent`) of the attempt that wrote the row, while tracing (docs/tracing.md).
    Column("trace_context", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("published_at", DateTime(timezone=True)),
    # A row Kafka refused for its content (too large, invalid): the relay passes over it (runbook).
    Column("set_aside_at", DateTime(timezone=True)),
    Column("set_aside_code", Text),
    # The relay only ever looks at unpublished rows: keep that index small.
    Index("ix_outbox_unpublished", "id", postgresql_where=text("published_at IS NULL")),
    Index("ix_outbox_set_aside", "id", postgresql_where=text("set_aside_at IS NOT NULL")),
    Index("ix_outbox_unpublished_key", "key", "id", postgresql_where=text("published_at IS NULL")),
)

effects = Table(
    "effects",
    metadata,
    Column("idempotency_key", Text, primary_key=True),
    Column("aggregate_id", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("state", String(16), nullable=False, server_default="pending"),
    Column("payload", JSONB, nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("reconcile_count", Integer, nullable=False, server_default="0"),
    Column("provider_ref", Text),
    Column("last_error_code", Text),
    Column("lease_until", DateTime(timezone=True)),
    Column("lease_owner", Text),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # The span context (`traceparent`) of the attempt that wrote the row, while tracing (docs/tracing.md).
    Column("trace_context", Text),
    CheckConstraint("state IN ('pending', 'in_flight', 'sent', 'uncertain', 'failed')", name="state"),
    Index("ix_effects_state_kind_next_attempt_at", "state", "kind", "next_attempt_at"),
    Index("ix_effects_aggregate_id", "aggregate_id"),
)

quarantine = Table(
    "quarantine",
    metadata,
    Column("failure_id", Text, nullable=False),
    Column("consumer_name", Text, nullable=False),
    Column("message_id", Text, nullable=False),
    Column("error_code", Text, nullable=False),
    Column("status", String(16), nullable=False, server_default="open"),
    Column("owner", Text, nullable=False),
    Column("ordering_key", Text),
    Column("envelope", JSONB, nullable=False),
    # The original bytes live only here, for reprocessing; never on a topic (contract §8).
    Column("payload", LargeBinary),
    Column("source_headers", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("attempts", Integer, nullable=False),
    Column("repeat_failures", Integer, nullable=False, server_default="0"),
    Column("first_failed_at", DateTime(timezone=True), nullable=False),
    Column("last_failed_at", DateTime(timezone=True), nullable=False),
    Column("resolution", Text),
    Column("resolved_by", Text),
    Column("resolved_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # When the original bytes and header values were removed (`quarantine erase`, or retention), and by whom: the
    # row's facts stay; a record without its bytes cannot be reprocessed.
    Column("erased_at", DateTime(timezone=True)),
    Column("erased_by", Text),
    # The span context (`traceparent`) of the attempt that wrote the row, while tracing (docs/tracing.md).
    Column("trace_context", Text),
    # Two consumer names reading one source topic each keep their own record of a failure (contract §7).
    PrimaryKeyConstraint("consumer_name", "failure_id"),
    CheckConstraint("status IN ('open', 'resolved', 'reprocessing', 'reprocessed')", name="status"),
    # A failure id named without its consumer (the CLI, the console) is looked up across consumers.
    Index("ix_quarantine_failure_id", "failure_id"),
    Index("ix_quarantine_status_first_failed_at", "status", "first_failed_at"),
    Index("ix_quarantine_message_id", "message_id", "consumer_name"),
    # The console's pages by key (migrations 0011, 0015): each filter's index ends in the order a page is read in,
    # the sort column then the record's key, so that no two rows share a page boundary.
    Index("ix_quarantine_page_by_first_failed_at", "first_failed_at", "failure_id", "consumer_name"),
    Index("ix_quarantine_page_by_last_failed_at", "last_failed_at", "failure_id", "consumer_name"),
    Index("ix_quarantine_page_by_error_code", "error_code", "first_failed_at", "failure_id", "consumer_name"),
    Index("ix_quarantine_page_by_owner", "owner", "first_failed_at", "failure_id", "consumer_name"),
    Index("ix_quarantine_ordering_key", "ordering_key"),
    # The overview's last day and the open counts per code and owner, read from the indexes alone.
    Index("ix_quarantine_created_at_error_code", "created_at", "error_code"),
    Index("ix_quarantine_status_error_code_owner", "status", "error_code", "owner"),
)

# A record between its first failure and its terminal state (blocking phase excluded: that lives in memory).
# Its row makes a redelivered copy of an earlier step a no-op, so each step reaches the tier topic once.
retries = Table(
    "retries",
    metadata,
    Column("consumer_name", Text, nullable=False),
    Column("message_id", Text, nullable=False),
    Column("ordering_key", Text),
    Column("failure_id", Text, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("tier_step", Integer, nullable=False),
    Column("first_failed_at", DateTime(timezone=True), nullable=False),
    Column("last_failed_at", DateTime(timezone=True), nullable=False),
    Column("due_at", DateTime(timezone=True), nullable=False),
    Column("error_code", Text, nullable=False),
    PrimaryKeyConstraint("consumer_name", "message_id"),
    Index("ix_retries_consumer_name_ordering_key", "consumer_name", "ordering_key"),
)

# Keys held by a quarantined head under ORDERS_ORDERING=key: released by an operator or by reprocessing.
key_blocks = Table(
    "key_blocks",
    metadata,
    Column("consumer_name", Text, nullable=False),
    Column("ordering_key", Text, nullable=False),
    Column("failure_id", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("since", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("consumer_name", "ordering_key"),
)

# Later records of a key whose head is retrying or quarantined (ORDERS_ORDERING=key), in arrival order.
parked = Table(
    "parked",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("consumer_name", Text, nullable=False),
    Column("ordering_key", Text, nullable=False),
    Column("message_id", Text, nullable=False),
    Column("source_topic", Text, nullable=False),
    Column("source_partition", Integer, nullable=False),
    Column("source_offset", BigInteger, nullable=False),
    Column("timestamp_ms", BigInteger, nullable=False),
    Column("value", LargeBinary),
    Column("headers", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("parked_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # The member releasing it now, until its lease ends (database time): one member applies a parked record.
    Column("claimed_by", Text),
    Column("claimed_until", DateTime(timezone=True)),
    # The record's original Kafka key (service.policy.records.pack_key): unparked records keep it byte-exact.
    Column("source_key", LargeBinary),
    # The span context (`traceparent`) of the attempt that wrote the row, while tracing (docs/tracing.md).
    Column("trace_context", Text),
    Index("ix_parked_consumer_name_ordering_key_id", "consumer_name", "ordering_key", "id"),
    # A record is parked once: a redelivery finds it here (the round's look-up) and parks nothing.
    Index("ux_parked_consumer_name_message_id", "consumer_name", "message_id", unique=True),
)

# One row per reconciler pass: operators and the "reconciler not run" alert read the last one.
reconcile_runs = Table(
    "reconcile_runs",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=False),
    Column("outcome", Text, nullable=False),
    Column("summary", JSONB, nullable=False),
    Index("ix_reconcile_runs_finished_at", "finished_at"),
)

# Notes on quarantined records; append-only (a trigger refuses UPDATE and DELETE).
quarantine_annotations = Table(
    "quarantine_annotations",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("consumer_name", Text, nullable=False),
    Column("failure_id", Text, nullable=False),
    Column("author", Text, nullable=False),
    Column("note", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_quarantine_annotations_consumer_name_failure_id", "consumer_name", "failure_id"),
)

# The audit of controlled reprocessing: one row per run, one per item.
reprocess_runs = Table(
    "reprocess_runs",
    metadata,
    Column("id", Text, primary_key=True),
    Column("actor", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("selection", JSONB, nullable=False),
    Column("options", JSONB, nullable=False),
    Column("counts", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("outcome", Text, nullable=False),
    Column("stop_reason", Text),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("finished_at", DateTime(timezone=True)),
)

reprocess_items = Table(
    "reprocess_items",
    metadata,
    Column("run_id", Text, nullable=False),
    # A run acts as one consumer: the failure id is unique within it, and names that consumer's record.
    Column("consumer_name", Text, nullable=False),
    Column("failure_id", Text, nullable=False),
    Column("message_id", Text, nullable=False),
    Column("stage", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("detail", Text),
    Column("published_at", DateTime(timezone=True)),
    Column("verified_at", DateTime(timezone=True)),
    PrimaryKeyConstraint("run_id", "failure_id"),
    Index("ix_reprocess_items_consumer_name_failure_id", "consumer_name", "failure_id"),
)

# The true timeline of each quarantined record: appended by triggers on quarantine, quarantine_annotations and
# reprocess_items (migrations 0009, 0015) and on retries (0020: each hand-off to a tier is a failed attempt),
# whatever path made the change; append-only, read in id order.
quarantine_events = Table(
    "quarantine_events",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("consumer_name", Text, nullable=False),
    Column("failure_id", Text, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("event", Text, nullable=False),
    Column("error_code", Text),
    Column("attempts", Integer),
    Column("actor", Text),
    Column("detail", Text),
    Index("ix_quarantine_events_consumer_name_failure_id_id", "consumer_name", "failure_id", "id"),
)

# An operator's correction of a quarantined record (migration 0020): the payload and headers before and after, the
# diff, and whether it waits for a second operator, was sent (once, under the original message id) or was rejected.
quarantine_edits = Table(
    "quarantine_edits",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("consumer_name", Text, nullable=False),
    Column("failure_id", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("state", Text, nullable=False),
    Column("payload_before", LargeBinary),
    Column("payload_after", LargeBinary, nullable=False),
    Column("headers_before", JSONB, nullable=False),
    Column("headers_after", JSONB, nullable=False),
    Column("diff", Text, nullable=False),
    Column("repeat_failures", Integer, nullable=False),
    Column("decided_by", Text),
    Column("decided_at", DateTime(timezone=True)),
    Column("sent_at", DateTime(timezone=True)),
    CheckConstraint("state IN ('pending_approval', 'sent', 'rejected')", name="state"),
    Index("ix_quarantine_edits_consumer_name_failure_id_id", "consumer_name", "failure_id", "id"),
)

# What operators did (CLI and console): actor, time, action, selection, result; append-only.
audit_log = Table(
    "audit_log",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("actor", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("selection", JSONB, nullable=False),
    Column("result", JSONB, nullable=False),
    Index("ix_audit_log_at", "at"),
)

# Console logins (contract §9), shared by every console replica: the row of a session is found by the hash of its
# cookie's opaque token (the token itself is stored nowhere); logout revokes it.
console_sessions = Table(
    "console_sessions",
    metadata,
    Column("id_hash", Text, primary_key=True),
    Column("operator", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("fingerprint", Text, nullable=False),  # the operator's token's (service/policy/operators.py)
    Column("tokens_digest", Text, nullable=False),  # the token list's at login: a changed list ends the session
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("revoked_at", DateTime(timezone=True)),
    Column("last_seen_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_console_sessions_expires_at", "expires_at"),
)

# One row per long-running process, upserted by its heartbeat (service/worker/heartbeat.py): what the console's
# Processes page and `status` show; `facts` is service/policy/heartbeat.py's document.
processes = Table(
    "processes",
    metadata,
    Column("process_id", Text, primary_key=True),
    Column("role", Text, nullable=False),
    Column("consumer_name", Text, nullable=False),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("version", Text, nullable=False),
    Column("interval_seconds", Float, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("last_seen", DateTime(timezone=True), nullable=False),
    Column("stopped_at", DateTime(timezone=True)),
    Column("facts", JSONB, nullable=False),
    Index("ix_processes_last_seen", "last_seen"),
)
