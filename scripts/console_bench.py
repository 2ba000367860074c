"""Time the operator console's pages on a large store (scripts/console-bench).

The store: 100,000 quarantined records and 1,000,000 inbox rows, with effects, outbox rows, held keys, reprocess
runs, reconciler passes, audit rows and the heartbeats of 20 live processes (and a month of gone ones) around
them. The script creates a fresh database on the local PostgreSQL, migrates it with the service's own
`upgrade_to_head`, fills it with set-based SQL (`INSERT … SELECT … FROM generate_series`; the triggers of migration
0009 write each record's timeline as they would in production) and runs `VACUUM ANALYZE`. Then it serves the
console with uvicorn on a socket of its own and times every page with a real HTTP client: a few warm-up requests,
then N in a row. Each request's SQL is traced, so the table also says how many statements a page ran and how long
the database took; `--explain FILE` writes every statement's `EXPLAIN (ANALYZE, BUFFERS)` to FILE.

The database is named `console_bench` (`--database`) and is dropped at the end unless `--keep`; `--reuse`
measures a kept one again (migrated to the head first, so a new index is measured without seeding again), and
`--revision 0010 --keep`, then `--reuse`, measures the same data before and after the migrations since 0010.
The last line of the output is one JSON object; exit 1 unless every page answered 200 within the limit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import socket
import statistics
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urljoin

import asyncpg  # type: ignore[import-untyped]
import httpx
import uvicorn
from alembic import command
from rich.console import Console
from rich.table import Table
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from service.codes import ErrorCode
from service.config import load_settings
from service.orders.codes import OrderCode
from service.orders.domain import DOMAIN
from service.orders.effects import SPECS as ORDER_EFFECT_SPECS
from service.orders.messages import invalid_field
from service.store.schema import alembic_config, upgrade_to_head
from service.store.uow import create_engine

console = Console(stderr=True)

LIMIT_MS = 200.0
CONSUMER = "order-service"
TOKEN = "bench-" + "x" * 40
BEARER = {"Authorization": f"Bearer {TOKEN}"}
DEEP_PAGES = 10  # "next page" links followed for the deep pages

# The quarantine's error codes, per mille of the records, with the team that owns them (as
# ORDERS_QUARANTINE_OWNERS would set it: six owners) and how many attempts a record spent before it came here.
CODES: tuple[tuple[str, int, str, int], ...] = (
    (ErrorCode.INVALID_FIELD, 220, "order-producers", 1),
    (ErrorCode.MALFORMED_PAYLOAD, 140, "partner-integrations", 1),
    (ErrorCode.DOWNSTREAM_UNAVAILABLE_EXHAUSTED, 120, "order-service-oncall", 4),
    (ErrorCode.DOWNSTREAM_TIMEOUT_EXHAUSTED, 100, "payments-team", 4),
    (ErrorCode.UNEXPECTED_ERROR_EXHAUSTED, 90, "order-service-oncall", 3),
    (ErrorCode.SCHEMA_UNSUPPORTED, 80, "checkout-web", 1),
    (ErrorCode.RATE_LIMITED_EXHAUSTED, 60, "order-service-oncall", 5),
    (OrderCode.UNKNOWN_TENANT, 50, "order-producers", 1),
    (ErrorCode.DOWNSTREAM_UNREACHABLE_EXHAUSTED, 40, "order-service-oncall", 4),
    (ErrorCode.PROCESSING_TIMEOUT_EXHAUSTED, 30, "order-service-oncall", 4),
    (OrderCode.UNKNOWN_CUSTOMER, 30, "checkout-web", 1),
    (OrderCode.PAYMENT_DECLINED, 19, "payments-team", 1),
    (OrderCode.INVALID_TRANSITION, 20, "order-producers", 1),
    (ErrorCode.UNREADABLE_RECORD, 1, "data-platform", 1),
)
FREQUENT_CODE = ErrorCode.INVALID_FIELD
RARE_CODE = ErrorCode.UNREADABLE_RECORD
DOMAIN_CODE = OrderCode.UNKNOWN_TENANT
OWNER = "payments-team"


@dataclass(frozen=True)
class Sizes:
    """How many rows the seed writes."""

    quarantine: int
    inbox: int
    effects: int = 20_000
    outbox: int = 60_000
    held_keys: int = 300
    annotations: int = 2_000
    audit: int = 3_000
    gone_processes: int = 8_000


def _slots() -> tuple[list[str], list[str], list[int]]:
    """`CODES` as three parallel arrays of 1,000 slots (code, owner, attempts): a uniform pick of a slot is a
    pick by weight."""
    codes, owners, attempts = [], [], []
    for code, weight, owner, tries in CODES:
        codes += [str(code)] * weight
        owners += [owner] * weight
        attempts += [tries] * weight
    assert len(codes) == 1_000, "the weights are per mille"
    return codes, owners, attempts


def _iso(column: str) -> str:
    """SQL for a timestamptz column as the envelope writes it (RFC 3339, UTC, milliseconds, `Z`)."""
    return f"""to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')"""


# Every step runs in the seed's one session, in this order, with $1 the quarantine size and $2 the inbox size
# where a step names them. A quarter of the records failed in the last 24 hours, the rest over the 29 days
# before; offsets grow with time, as they do on a topic.
_QUARANTINE = f"""
    INSERT INTO quarantine (failure_id, consumer_name, message_id, error_code, owner, ordering_key, envelope, payload,
                            source_headers, attempts, first_failed_at, last_failed_at, created_at, updated_at)
    SELECT failure_id, '{CONSUMER}', message_id, code, owner, key,
           jsonb_build_object(
               'failureId', failure_id, 'messageId', message_id,
               'source', jsonb_build_object('topic', 'orders', 'partition', part, 'offset', "offset",
                                            'timestamp', {_iso("first_failed_at")}, 'key', key),
               'consumer', '{CONSUMER}', 'attempt', attempts, 'firstFailedAt', {_iso("first_failed_at")},
               'lastFailedAt', {_iso("last_failed_at")}, 'errorCode', code, 'payloadSchema', 'order.placed.v1',
               'traceId', md5(failure_id)),
           convert_to(CASE WHEN code = 'MALFORMED_PAYLOAD' THEN left(document, 120) ELSE document END, 'UTF8'),
           jsonb_build_array(jsonb_build_array('message-id', message_id),
                             jsonb_build_array('traceparent', '00-' || md5(failure_id) || '-01')),
           attempts, first_failed_at, last_failed_at, last_failed_at + interval '0.2 s',
           last_failed_at + interval '0.2 s'
    FROM (
        SELECT *, first_failed_at + interval '5 minutes' * (attempts - 1) AS last_failed_at,
               'orders/' || part || '/' || "offset" AS failure_id,
               coalesce(key, 'nokey') || '.' || i || '/order.' || (ARRAY['placed', 'shipped', 'cancelled'])[1 + i % 3]
                   AS message_id,
               format('{{"type":"order.placed.v1","order_id":"%s","tenant":"%s","customer_id":"cus-%s",'
                      '"amount_cents":%s,"currency":"EUR","lines":[{{"sku":"SKU-%s","quantity":%s}}],'
                      '"placed_at":"%s"}}',
                      coalesce(key, 'ord-x'), (ARRAY['acme', 'globex', 'initech'])[1 + i % 3], i % 9000,
                      100 + i % 90000, i % 500, 1 + i % 4, {_iso("first_failed_at")}) AS document
        FROM (
            SELECT i, codes[slot] AS code, owners[slot] AS owner,
                   CASE WHEN tries[slot] = 1 THEN 1 ELSE tries[slot] + floor(spread * 3)::int END AS attempts,
                   CASE WHEN pick < 0.03 THEN NULL
                        ELSE 'ord-' || lpad(floor((pick - 0.03) / 0.97 * n * 0.4)::text, 7, '0') END AS key,
                   CASE WHEN i > n * 0.75 THEN now() - interval '24 hours' * ((n - i + jitter) / (n * 0.25))
                        ELSE now() - interval '1 day' - interval '29 days' * ((n * 0.75 - i + jitter) / (n * 0.75))
                   END AS first_failed_at,
                   i % 12 AS part, 4000000 + (i / 12) * 9 AS "offset"
            FROM (
                SELECT i, $1::int AS n, 1 + floor(random() * 1000)::int AS slot, random() AS jitter,
                       random() AS pick, random() AS spread, $3::text[] AS codes, $4::text[] AS owners,
                       $5::int[] AS tries
                FROM generate_series(1, $1::int) AS i
            ) AS drawn
        ) AS shaped
    ) AS records
"""
_RUNS = """
    INSERT INTO reprocess_runs (id, actor, reason, selection, options, counts, outcome, stop_reason, started_at,
                                finished_at)
    SELECT 'rp-' || left(md5('run ' || n), 12), (ARRAY['alice', 'bob', 'carol'])[1 + n % 3],
           'INC-' || (4100 + n) || ': downstream back, send them again',
           jsonb_build_object('failure_ids', '[]'::jsonb, 'error_code', NULL, 'since', NULL, 'until', NULL),
           jsonb_build_object('sample', 20, 'rate', 50, 'max_failure_rate', 0.2, 'dry_run', false),
           '{}', CASE WHEN n = 5 THEN 'stopped' ELSE 'completed' END,
           CASE WHEN n = 5 THEN 'not confirmed after the sample' END,
           now() - interval '1 day' * days, now() - interval '1 day' * days + interval '20 minutes'
    FROM unnest(ARRAY[26, 22, 18, 14, 10, 7, 4, 1.5]::float8[]) WITH ORDINALITY AS r(days, n)
"""
# Reprocessed records (about 5 %, none of the last day), each sent by the first run after it failed.
_REPROCESS_ITEMS = """
    INSERT INTO reprocess_items (run_id, consumer_name, failure_id, message_id, stage, attempt, outcome, detail,
                                 published_at, verified_at)
    SELECT run_id, consumer_name, failure_id, message_id,
           CASE WHEN row_number() OVER (PARTITION BY run_id) <= 20 THEN 'sample' ELSE 'main' END,
           1, outcome, CASE outcome WHEN 'reprocessed' THEN 'inbox processed, 1 effects'
                                    WHEN 'noop' THEN 'already processed' ELSE 'quarantined again (repeat 1)' END,
           started_at + interval '1 minute', started_at + interval '2 minutes'
    FROM (
        SELECT q.consumer_name, q.failure_id, q.message_id, run.id AS run_id, run.started_at,
               CASE WHEN random() < 0.03 THEN 'noop' WHEN random() < 0.02 THEN 'failed_again' ELSE 'reprocessed' END
                   AS outcome
        FROM quarantine q
        CROSS JOIN LATERAL (SELECT id, started_at FROM reprocess_runs r WHERE r.started_at > q.last_failed_at
                            ORDER BY r.started_at LIMIT 1) AS run
        WHERE q.first_failed_at < now() - interval '1 day' AND random() < 0.055
    ) AS chosen
"""
_RUN_COUNTS = """
    UPDATE reprocess_runs r SET counts = jsonb_build_object(
        'selected', c.selected, 'published', c.selected, 'reprocessed', c.reprocessed, 'noop', c.noop,
        'failed_again', c.failed_again, 'unexpected_duplicate', 0, 'unverified', 0, 'undecodable', '[]'::jsonb)
    FROM (SELECT run_id, count(*) AS selected, count(*) FILTER (WHERE outcome = 'reprocessed') AS reprocessed,
                 count(*) FILTER (WHERE outcome = 'noop') AS noop,
                 count(*) FILTER (WHERE outcome = 'failed_again') AS failed_again
          FROM reprocess_items GROUP BY run_id) AS c
    WHERE c.run_id = r.id
"""
_REPROCESSED = """
    UPDATE quarantine q SET status = 'reprocessed', updated_at = i.verified_at
    FROM reprocess_items i
    WHERE i.consumer_name = q.consumer_name AND i.failure_id = q.failure_id AND i.outcome IN ('reprocessed', 'noop')
"""
_FAILED_AGAIN = """
    UPDATE quarantine q SET repeat_failures = 1, attempts = q.attempts + 1, last_failed_at = i.verified_at,
                            updated_at = i.verified_at
    FROM reprocess_items i
    WHERE i.consumer_name = q.consumer_name AND i.failure_id = q.failure_id AND i.outcome = 'failed_again'
"""
# About a tenth resolved by an operator (none of the last day), and a few records being reprocessed now.
_RESOLVED = """
    UPDATE quarantine
    SET status = 'resolved', resolved_by = (ARRAY['alice', 'bob', 'carol'])[1 + floor(random() * 3)::int],
           resolution = (ARRAY['producer fixed and re-sent', 'test traffic', 'duplicate of a later order',
                               'customer refunded by hand'])[1 + floor(random() * 4)::int],
           resolved_at = last_failed_at + interval '3 hours', updated_at = last_failed_at + interval '3 hours'
    WHERE status = 'open' AND repeat_failures = 0 AND first_failed_at < now() - interval '1 day' AND random() < 0.14
"""
_REPROCESSING = """
    UPDATE quarantine SET status = 'reprocessing', updated_at = now()
    WHERE failure_id IN (SELECT failure_id FROM quarantine
                         WHERE status = 'open' AND error_code = 'RATE_LIMITED_EXHAUSTED'
                         ORDER BY first_failed_at DESC LIMIT 50)
"""
_ANNOTATIONS = """
    INSERT INTO quarantine_annotations (consumer_name, failure_id, author, note, created_at)
    SELECT consumer_name, failure_id, (ARRAY['alice', 'bob', 'carol', 'dave'])[1 + floor(random() * 4)::int],
           (ARRAY['looking into it', 'producer ticket opened', 'same as INC-4102', 'waiting for the provider'])
               [1 + floor(random() * 4)::int],
           last_failed_at + interval '1 hour'
    FROM quarantine TABLESAMPLE BERNOULLI (100.0 * $6::int / $1::int) REPEATABLE (16)
"""
# Held keys: the newest open records with a key hold theirs, with one to six later records of it parked; a few
# keys are held by a record still retrying.
_KEY_BLOCKS = f"""
    INSERT INTO key_blocks (consumer_name, ordering_key, failure_id, reason, since)
    SELECT '{CONSUMER}', ordering_key, failure_id, 'quarantined', last_failed_at
    FROM (SELECT DISTINCT ON (ordering_key) ordering_key, failure_id, last_failed_at FROM quarantine
          WHERE status = 'open' AND ordering_key IS NOT NULL AND first_failed_at > now() - interval '3 days'
          ORDER BY ordering_key, first_failed_at) AS heads
    ORDER BY md5(ordering_key) LIMIT $7::int
"""
_RETRIES = f"""
    INSERT INTO retries (consumer_name, message_id, ordering_key, failure_id, attempts, tier_step, first_failed_at,
                         last_failed_at, due_at, error_code)
    SELECT '{CONSUMER}', key || '.1/order.placed', key, 'orders/' || n % 12 || '/' || (9000000 + n), 2, 1,
           now() - interval '6 minutes', now() - interval '1 minute', now() + interval '4 minutes',
           (ARRAY['DOWNSTREAM_UNAVAILABLE', 'RATE_LIMITED', 'DOWNSTREAM_TIMEOUT'])[1 + n % 3]
    FROM (SELECT n, 'ord-r' || lpad(n::text, 6, '0') AS key FROM generate_series(1, 40) AS n) AS k
"""
_PARKED = f"""
    INSERT INTO parked (consumer_name, ordering_key, message_id, source_topic, source_partition, source_offset,
                        timestamp_ms, value, headers, parked_at, source_key)
    SELECT '{CONSUMER}', ordering_key, ordering_key || '.p' || k || '/order.shipped', 'orders',
           abs(hashtext(ordering_key)) % 12, 9500000 + row_number() OVER (), extract(epoch FROM since)::bigint * 1000,
           convert_to('{{"type":"order.shipped.v1","order_id":"' || ordering_key || '","carrier":"dhl"}}', 'UTF8'),
           jsonb_build_array(jsonb_build_array('message-id', ordering_key || '.p' || k || '/order.shipped')),
           since + interval '1 minute' * k, convert_to(ordering_key, 'UTF8')
    FROM (SELECT ordering_key, since FROM key_blocks
          UNION ALL SELECT ordering_key, first_failed_at FROM retries) AS held
    CROSS JOIN LATERAL generate_series(1, 1 + abs(hashtext(ordering_key)) % 6) AS k
"""
# The inbox: a row for every quarantined record (processed once reprocessed), the rest processed or rejected.
_INBOX_QUARANTINED = f"""
    INSERT INTO inbox (consumer_name, message_id, status, source_topic, source_partition, source_offset, aggregate_id,
                       error_code, received_at, processed_at)
    SELECT '{CONSUMER}', message_id, CASE WHEN status = 'reprocessed' THEN 'processed' ELSE 'quarantined' END,
           'orders', (envelope -> 'source' ->> 'partition')::int, (envelope -> 'source' ->> 'offset')::bigint,
           ordering_key, CASE WHEN status = 'reprocessed' THEN NULL ELSE error_code END,
           first_failed_at - interval '1 second', created_at
    FROM quarantine
"""
_INBOX_REST = f"""
    INSERT INTO inbox (consumer_name, message_id, status, source_topic, source_partition, source_offset, aggregate_id,
                       error_code, received_at, processed_at)
    SELECT '{CONSUMER}', 'ord-' || lpad(i::text, 8, '0') || '.1/order.placed',
           CASE WHEN i % 33 = 0 THEN 'rejected' ELSE 'processed' END, 'orders', i % 12, 1000000 + i / 12,
           'ord-' || lpad(i::text, 8, '0'),
           CASE WHEN i % 33 = 0 THEN (ARRAY['UNKNOWN_TENANT', 'ORDER_EXISTS', 'CUSTOMER_BLOCKED'])[1 + i % 3] END,
           at, at + interval '15 milliseconds'
    FROM (SELECT i, now() - interval '30 days' * (1 - i::float8 / ($2::int - quarantined)) AS at
          FROM (SELECT count(*) AS quarantined FROM quarantine) AS q, generate_series(1, $2::int - quarantined) AS i
         ) AS rows
"""
_EFFECTS = """
    INSERT INTO effects (idempotency_key, aggregate_id, kind, state, payload, attempts, reconcile_count, provider_ref,
                         last_error_code, lease_until, lease_owner, next_attempt_at, created_at, updated_at)
    SELECT aggregate_id || '/' || kind, aggregate_id, kind, state,
           jsonb_build_object('order_id', aggregate_id, 'amount_cents', 100 + i % 90000, 'currency', 'EUR',
                              'kind', split_part(kind, '.', 2)),
           CASE state WHEN 'pending' THEN i % 3 WHEN 'failed' THEN 5 ELSE 1 + i % 2 END,
           CASE WHEN state IN ('uncertain', 'failed') THEN i % 3 ELSE 0 END,
           CASE WHEN state = 'sent' THEN 'pay_' || left(md5(aggregate_id || kind), 16) END,
           CASE state WHEN 'failed' THEN (ARRAY['PROVIDER_REJECTED', 'NOT_FOUND_AFTER_RECONCILE', 'PAYMENT_DECLINED'])
                                             [1 + i % 3]
                      WHEN 'uncertain' THEN 'DOWNSTREAM_TIMEOUT' END,
           CASE WHEN state = 'in_flight' THEN now() + interval '30 seconds' END,
           CASE WHEN state = 'in_flight' THEN 'effects-worker-1' END,
           CASE WHEN state = 'pending' THEN now() + interval '1 second' * (i % 120) ELSE at END, at,
           at + interval '2 seconds'
    FROM (SELECT i, 'ord-' || lpad((i * 37)::text, 8, '0') AS aggregate_id,
                 CASE WHEN i % 20 < 12 THEN 'payment.capture' WHEN i % 20 < 17 THEN 'email.shipped'
                      ELSE 'payment.refund' END AS kind,
                 CASE WHEN draw < 0.75 THEN 'sent' WHEN draw < 0.83 THEN 'pending' WHEN draw < 0.85 THEN 'in_flight'
                      WHEN draw < 0.89 THEN 'uncertain' ELSE 'failed' END AS state,
                 now() - interval '30 days' * (1 - i::float8 / $8::int) AS at
          FROM (SELECT i, random() AS draw FROM generate_series(1, $8::int) AS i) AS drawn) AS rows
"""
# The outbox after a week: published rows not yet purged, a relay backlog of a thousand, twenty set aside.
_OUTBOX = """
    INSERT INTO outbox (topic, key, headers, payload, created_at, published_at, set_aside_at, set_aside_code)
    SELECT 'orders.events', key, jsonb_build_object('event-id', key || '.1/order.accepted', 'event-type',
                                                    'order.accepted', 'message-id', key || '.1/order.placed'),
           convert_to('{"type":"order.accepted","orderId":"' || key || '","tenant":"acme","amountCents":' || i
                      || ',"currency":"EUR"}', 'UTF8'),
           at, CASE WHEN i <= $9::int - 1020 THEN at + interval '40 milliseconds' END,
           CASE WHEN i > $9::int - 20 THEN at + interval '1 second' END,
           CASE WHEN i > $9::int - 20 THEN 'MESSAGE_TOO_LARGE' END
    FROM (SELECT i, 'ord-' || lpad(i::text, 8, '0') AS key,
                 CASE WHEN i <= $9::int - 1020 THEN now() - interval '7 days' * (1 - i::float8 / $9::int)
                      ELSE now() - interval '10 minutes' * (($9::int - i)::float8 / 1020) END AS at
          FROM generate_series(1, $9::int) AS i) AS rows
"""
_RECONCILE_RUNS = """
    INSERT INTO reconcile_runs (started_at, finished_at, outcome, summary)
    SELECT at, at + interval '1.4 seconds', 'complete',
           jsonb_build_object('leases_expired', 0, 'resolved_sent', n % 4, 'sent_back_to_pending', n % 2,
                              'failed', 0, 'still_uncertain', n % 5, 'inbox_purged', 0, 'outbox_purged', n % 700,
                              'retry_orphans_removed', 0, 'seconds', 1.4, 'complete', true)
    FROM generate_series(now() - interval '30 days', now(), interval '5 minutes') WITH ORDINALITY AS g(at, n)
"""
_AUDIT = """
    INSERT INTO audit_log (at, actor, action, selection, result)
    SELECT now() - interval '30 days' * (1 - n::float8 / $10::int),
           (ARRAY['alice', 'bob', 'carol', 'dave'])[1 + n % 4],
           (ARRAY['quarantine.reveal', 'quarantine.annotate', 'quarantine.resolve', 'parked.release',
                  'effects.retry'])[1 + n % 5],
           jsonb_build_object('failure_id', 'orders/' || n % 12 || '/' || (4000000 + n * 9), 'via', 'console'),
           jsonb_build_object('done', true)
    FROM generate_series(1, $10::int) AS n
"""
# Twenty live processes (sixteen consumers, each with a partition of the source, its tiers and its reprocess topic,
# two relays, two effect workers; one consumer with an open breaker, one pausing for backpressure), and a month of
# processes since gone or stopped that the pages must skip: a restart every few minutes.
_PROCESSES = """
    INSERT INTO processes (process_id, role, consumer_name, host, pid, version, interval_seconds, started_at,
                           last_seen, stopped_at, facts)
    SELECT 'order-service-' || n || ':' || (1000 + n) || ':' || n, role, 'order-service', 'order-service-' || n,
           1000 + n, '0.1.0', 5, seen - interval '3 hours', seen, CASE WHEN n > 20 AND n % 3 > 0 THEN seen END,
           jsonb_build_object(
               'partitions', CASE WHEN role = 'consume' THEN (
                   SELECT jsonb_agg(jsonb_build_object(
                       'topic', topic, 'partition', (n - 1) % 12, 'lag', (n * 37 + length(topic)) % 400,
                       'paused', CASE WHEN n = 5 AND topic = 'orders' THEN 'backpressure: its lane is full' END,
                       'oldest_ms', (extract(epoch FROM now()) * 1000)::bigint - n * 1500))
                   FROM unnest(ARRAY['orders', 'orders.retry.30s', 'orders.retry.5m', 'orders.reprocess']) AS topic)
                   ELSE '[]'::jsonb END,
               'rates', jsonb_build_object('rounds_per_second', 12.5, 'records_per_second', 2400.0,
                                           'published_per_second', 0.0, 'effects_per_second', 0.0),
               'breakers', CASE WHEN n = 3 THEN jsonb_build_array(jsonb_build_object(
                                   'downstream', 'customers', 'state', 'open', 'code', 'DOWNSTREAM_UNAVAILABLE',
                                   'misconfigured', false, 'open_seconds', 42.0))
                                ELSE jsonb_build_array(jsonb_build_object(
                                   'downstream', 'customers', 'state', 'closed', 'code', null,
                                   'misconfigured', false, 'open_seconds', 0.0)) END,
               'config_errors', '[]'::jsonb)
    FROM (SELECT n, CASE WHEN n > 20 THEN (ARRAY['consume', 'relay', 'effects'])[1 + n % 3]
                         WHEN n <= 16 THEN 'consume' WHEN n <= 18 THEN 'relay' ELSE 'effects' END AS role,
                 CASE WHEN n <= 20 THEN now() - interval '1 second' * (n % 4)
                      ELSE now() - interval '30 days' * ((n - 20)::float8 / $11::int) END AS seen
          FROM generate_series(1, 20 + $11::int) AS n) AS rows
"""
SEED: tuple[tuple[str, str], ...] = (
    ("quarantine", _QUARANTINE),
    ("reprocess runs", _RUNS),
    ("reprocess items", _REPROCESS_ITEMS),
    ("run counts", _RUN_COUNTS),
    ("reprocessed", _REPROCESSED),
    ("failed again", _FAILED_AGAIN),
    ("resolved", _RESOLVED),
    ("reprocessing", _REPROCESSING),
    ("annotations", _ANNOTATIONS),
    ("key blocks", _KEY_BLOCKS),
    ("retries", _RETRIES),
    ("parked", _PARKED),
    ("inbox (quarantined)", _INBOX_QUARANTINED),
    ("inbox (the rest)", _INBOX_REST),
    ("effects", _EFFECTS),
    ("outbox", _OUTBOX),
    ("reconcile runs", _RECONCILE_RUNS),
    ("audit log", _AUDIT),
    ("processes", _PROCESSES),
)
_COUNTED = (
    "quarantine",
    "quarantine_events",
    "quarantine_annotations",
    "inbox",
    "effects",
    "outbox",
    "key_blocks",
    "parked",
    "retries",
    "reprocess_runs",
    "reprocess_items",
    "reconcile_runs",
    "audit_log",
    "processes",
)


_PLACEHOLDER = re.compile(r"\$(\d+)")


def _parameters(sizes: Sizes) -> list[Any]:
    """The seed statements' $1…$11, by position."""
    codes, owners, attempts = _slots()
    return [
        sizes.quarantine,
        sizes.inbox,
        codes,
        owners,
        attempts,
        sizes.annotations,
        sizes.held_keys,
        sizes.effects,
        sizes.outbox,
        sizes.audit,
        sizes.gone_processes,
    ]


async def seed(dsn: str, sizes: Sizes) -> dict[str, int]:
    """Fill a migrated database, then VACUUM ANALYZE it; the rows of each table."""
    parameters = _parameters(sizes)
    connection = await asyncpg.connect(dsn)
    try:
        # The seed's own session only: nothing here needs to survive a crash, and the data is the same each run.
        await connection.execute("SET synchronous_commit = off; SET maintenance_work_mem = '256MB'")
        await connection.fetchval("SELECT setseed(0.16)")
        for label, statement in SEED:
            started = time.perf_counter()
            used = [parameters[number - 1] for number in _used(statement)]
            status = await connection.execute(_numbered(statement), *used)
            console.print(f"  {label}: {status} ({time.perf_counter() - started:.1f} s)")
        started = time.perf_counter()
        await connection.execute("VACUUM ANALYZE")
        console.print(f"  VACUUM ANALYZE ({time.perf_counter() - started:.1f} s)")
        return await _counts(connection)
    finally:
        await connection.close()


def _used(statement: str) -> list[int]:
    """The numbers of the seed parameters a statement names, in order."""
    return sorted({int(number) for number in _PLACEHOLDER.findall(statement)})


def _numbered(statement: str) -> str:
    """The statement with its placeholders renumbered 1…k, in the order of `_used`: asyncpg takes only the
    parameters a statement names."""
    renumbered = {old: new for new, old in enumerate(_used(statement), start=1)}
    return _PLACEHOLDER.sub(lambda match: f"${renumbered[int(match.group(1))]}", statement)


async def _counts(connection: asyncpg.Connection) -> dict[str, int]:
    """Rows per seeded table."""
    return {table: int(await connection.fetchval(f"SELECT count(*) FROM {table}")) for table in _COUNTED}


@dataclass(frozen=True)
class Samples:
    """Values the pages are asked about: picked from the seeded data."""

    key: str
    held_key: str
    message_id: str
    failure_id: str
    effect_key: str
    run_id: str
    since: str
    until: str


_SAMPLES = """
    SELECT
        (SELECT ordering_key FROM quarantine WHERE status = 'open' AND ordering_key IS NOT NULL
         GROUP BY ordering_key ORDER BY count(*) DESC, ordering_key LIMIT 1) AS key,
        (SELECT ordering_key FROM parked GROUP BY ordering_key ORDER BY count(*) DESC, ordering_key LIMIT 1)
            AS held_key,
        (SELECT message_id FROM quarantine ORDER BY failure_id OFFSET (SELECT count(*) / 2 FROM quarantine) LIMIT 1)
            AS message_id,
        (SELECT failure_id FROM quarantine_events GROUP BY failure_id ORDER BY count(*) DESC, failure_id LIMIT 1)
            AS failure_id,
        (SELECT idempotency_key FROM effects WHERE state = 'failed' ORDER BY idempotency_key LIMIT 1) AS effect_key,
        (SELECT run_id FROM reprocess_items GROUP BY run_id ORDER BY count(*) DESC LIMIT 1) AS run_id,
        to_char((now() - interval '3 days') AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS since,
        to_char((now() - interval '2 days') AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS until
"""


async def samples(dsn: str) -> Samples:
    """The values of the seeded database that the parametrised pages ask about."""
    connection = await asyncpg.connect(dsn)
    try:
        row = await connection.fetchrow(_SAMPLES)
    finally:
        await connection.close()
    assert row is not None
    return Samples(**dict(row))


@dataclass(frozen=True)
class Page:
    """One page to time: a label, and its path, or the listing whose `next` link is followed `deep` times."""

    label: str
    path: str
    deep: int = 0


def pages(found: Samples) -> list[Page]:
    """Every console page, with the filters an operator uses."""

    def listing(**filters: str) -> str:
        """The queue's path with these query parameters."""
        return "/quarantine?" + urlencode(filters)

    record = quote(found.failure_id, safe="/")
    return [
        Page("home", "/"),
        Page("quarantine", "/quarantine"),
        Page("open", listing(status="open")),
        Page("newest first", listing(sort="last_failed_at", direction="desc")),
        Page("by code (22 %)", listing(error_code=FREQUENT_CODE)),
        Page("by code (0.1 %)", listing(error_code=RARE_CODE)),
        Page("by domain code (5 %)", listing(error_code=DOMAIN_CODE)),
        Page("by owner", listing(owner=OWNER)),
        Page("open, one key", listing(status="open", key=found.key)),
        Page("one message id", listing(message_id=found.message_id)),
        Page("older than 7 days", listing(older_than="7d")),
        Page("one day's window", listing(since=found.since, until=found.until)),
        Page(f"page {DEEP_PAGES + 1}", "/quarantine", deep=DEEP_PAGES),
        Page(f"page {DEEP_PAGES + 1}, by code", listing(error_code=FREQUENT_CODE), deep=DEEP_PAGES),
        Page("record", f"/quarantine/{record}"),
        Page("keys", "/keys"),
        Page("held key", "/keys/detail?" + urlencode({"consumer": CONSUMER, "key": found.held_key})),
        Page("effects", "/effects"),
        Page("effect", f"/effects/{quote(found.effect_key, safe='/')}"),
        Page("runs", "/runs"),
        Page("run", f"/runs/{quote(found.run_id)}"),
        Page("audit", "/audit"),
        Page("processes", "/processes"),
        Page("api: quarantine", "/api/quarantine"),
        Page("api: record", f"/api/quarantine/{record}"),
        Page("api: stats", "/api/stats"),
        Page("api: processes", "/api/processes"),
    ]


class _NextLink(HTMLParser):
    """The href of the first `<a rel="next">` (or `<link rel="next">`) of a page."""

    def __init__(self) -> None:
        """No link seen yet."""
        super().__init__()
        self.href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        """Keep the first next link's href."""
        values = dict(attrs)
        if self.href is None and tag in ("a", "link") and "next" in (values.get("rel") or "").split():
            self.href = values.get("href")


def next_link(url: str, html: str) -> str | None:
    """The absolute URL of a listing's next page, or None on its last page."""
    parser = _NextLink()
    parser.feed(html)
    return urljoin(url, parser.href) if parser.href else None


@dataclass
class Statement:
    """One SQL statement a request ran, with its parameters and how long the database took."""

    sql: str
    parameters: Any
    ms: float


@dataclass
class Tracer:
    """Collects the statements of the current request (requests are sent one at a time)."""

    statements: list[Statement] = field(default_factory=list)
    _started: dict[int, float] = field(default_factory=dict)

    def attach(self, engine: AsyncEngine) -> None:
        """Time every statement the engine runs."""
        event.listen(engine.sync_engine, "before_cursor_execute", self._before)
        event.listen(engine.sync_engine, "after_cursor_execute", self._after)

    def _before(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        """A statement starts (SQLAlchemy's `before_cursor_execute`)."""
        self._started[id(cursor)] = time.perf_counter()

    def _after(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        """A statement ended (`after_cursor_execute`): keep it, with its time."""
        started = self._started.pop(id(cursor), time.perf_counter())
        self.statements.append(Statement(statement, parameters, (time.perf_counter() - started) * 1000))

    @contextmanager
    def request(self) -> Iterator[list[Statement]]:
        """The statements run inside the block (those run outside any block are not kept)."""
        self.statements = []
        try:
            yield self.statements
        finally:
            self.statements = []


@dataclass
class Timing:
    """A page's figures: milliseconds per request, statuses, and the SQL of its last request."""

    page: Page
    path: str
    ms: list[float]
    statuses: set[int]
    queries: int
    db_ms: list[float]
    statements: list[Statement]

    @property
    def p50(self) -> float:
        """The median."""
        return statistics.median(self.ms)

    @property
    def p95(self) -> float:
        """The 95th percentile (inclusive method: never above the largest sample)."""
        return statistics.quantiles(self.ms, n=20, method="inclusive")[18] if len(self.ms) > 1 else self.ms[0]

    @property
    def ok(self) -> bool:
        """Every response was 200 and 95 % of them came within the limit."""
        return self.statuses == {200} and self.p95 < LIMIT_MS

    def figures(self) -> dict[str, Any]:
        """As the JSON line reports them."""
        return {
            "path": self.path,
            "p50_ms": round(self.p50, 1),
            "p95_ms": round(self.p95, 1),
            "max_ms": round(max(self.ms), 1),
            "statuses": sorted(self.statuses),
            "queries": self.queries,
            "db_p50_ms": round(statistics.median(self.db_ms), 1),
        }


async def _resolve(client: httpx.AsyncClient, page: Page) -> str:
    """The path to time: the page's own, or the one `deep` next links further on."""
    url = str(client.base_url.join(page.path))
    for _ in range(page.deep):
        response = await client.get(url)
        following = next_link(url, response.text) if response.status_code == 200 else None
        if following is None:
            raise RuntimeError(f"{page.label}: no next link on {url} (status {response.status_code})")
        url = following
    return url.removeprefix(str(client.base_url).rstrip("/"))


async def time_page(client: httpx.AsyncClient, tracer: Tracer, page: Page, warmup: int, requests: int) -> Timing:
    """Warm the page up, then send `requests` in a row and time each."""
    path = await _resolve(client, page)
    for _ in range(warmup):
        await client.get(path)
    ms: list[float] = []
    db_ms: list[float] = []
    statuses: set[int] = set()
    last: list[Statement] = []
    for _ in range(requests):
        with tracer.request() as statements:
            started = time.perf_counter()
            response = await client.get(path)
            ms.append((time.perf_counter() - started) * 1000)
        statuses.add(response.status_code)
        db_ms.append(sum(one.ms for one in statements))
        last = statements
    return Timing(page, path, ms, statuses, len(last), db_ms, last)


async def _unavailable(*_: Any, **__: Any) -> Any:
    """The bench's reprocess: no page it times may start one."""
    raise RuntimeError("console-bench: reprocessing is not available")


@asynccontextmanager
async def served(url: str, tracer: Tracer) -> AsyncIterator[httpx.AsyncClient]:
    """The console on a free local port, lifespan and all, and a client that is logged in to it."""
    from service.console.app import create_app
    from service.console.web import Wiring

    settings = load_settings(database_url=url, console_tokens=f"bench:operator:{TOKEN}")
    engine = create_engine(url)
    tracer.attach(engine)
    app = create_app(
        Wiring(
            settings=settings,
            engine=engine,
            effect_specs=ORDER_EFFECT_SPECS,
            failing_field=invalid_field,
            reprocess=_unavailable,
            codes=DOMAIN.error_codes,
        )
    )
    # The socket listens before uvicorn starts: the first request waits in the backlog until the lifespan has run.
    # TCP_NODELAY, inherited by every accepted connection: uvicorn writes a response's head and body separately,
    # and without it the body waits for the client's delayed ACK of the head (about 40 ms on Linux).
    sock = socket.create_server(("127.0.0.1", 0), backlog=64)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=BEARER, timeout=30) as client:
            yield client
    finally:
        server.should_exit = True
        await serving
        sock.close()
        await engine.dispose()


async def explain(dsn: str, timings: Sequence[Timing], path: Path) -> None:
    """Write `EXPLAIN (ANALYZE, BUFFERS)` of every statement of each page's last request to `path`."""
    connection = await asyncpg.connect(dsn, server_settings={"plan_cache_mode": "force_custom_plan"})
    try:
        with path.open("w") as out:
            for timing in timings:
                out.write(f"=== {timing.page.label}: GET {timing.path}\n\n")
                for one in timing.statements:
                    parameters = list(one.parameters or ())
                    out.write(f"--- {one.ms:.1f} ms in the request; parameters {parameters!r}\n{one.sql.strip()}\n\n")
                    if not one.sql.lstrip().upper().startswith(("SELECT", "WITH")):
                        continue
                    async with connection.transaction():
                        plan = await connection.fetch("EXPLAIN (ANALYZE, BUFFERS) " + one.sql, *parameters)
                    out.write("\n".join(row[0] for row in plan) + "\n\n")
    finally:
        await connection.close()


def migrate(url: str, revision: str | None) -> None:
    """Migrate with the service's own migrations: to the head, or to `revision`."""
    if revision is None:
        upgrade_to_head(url, DOMAIN.migrations)
        return
    with alembic_config(url, DOMAIN.migrations) as config:
        command.upgrade(config, revision)


@dataclass(frozen=True)
class Options:
    """The command line, read."""

    admin_url: str
    database: str
    sizes: Sizes
    requests: int
    warmup: int
    keep: bool
    reuse: bool
    revision: str | None
    seed_only: bool
    explain: Path | None


# The 20 live processes' heartbeats while the pages are timed, as they write them: each every 5 s.
_BEAT = "UPDATE processes SET last_seen = now() WHERE pid = $1"
LIVE_PROCESSES = 20


@asynccontextmanager
async def heartbeats(dsn: str) -> AsyncIterator[None]:
    """Keep the seeded live processes live (a heartbeat each every 5 s) for the block: seeded minutes before the
    timing starts, they would be gone by then."""
    connection = await asyncpg.connect(dsn)

    async def beating() -> None:
        while True:
            for n in range(1, LIVE_PROCESSES + 1):
                await connection.execute(_BEAT, 1000 + n)
                await asyncio.sleep(5 / LIVE_PROCESSES)

    task = asyncio.create_task(beating())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await connection.close()


async def run(options: Options) -> dict[str, Any]:
    """Seed (or reuse), serve, time every page; the figures for the JSON line."""
    server = options.admin_url.rsplit("/", 1)[0]
    dsn = f"{server}/{options.database}"
    url = "postgresql+asyncpg://" + dsn.removeprefix("postgresql://")
    figures: dict[str, Any] = {
        "database": options.database,
        "cpus": os.cpu_count(),
        "load_1m_at_start": round(os.getloadavg()[0], 2),
    }
    admin = await asyncpg.connect(options.admin_url)
    try:
        figures["postgresql"] = await admin.fetchval("SHOW server_version")
        exists = await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", options.database)
        if not (options.reuse and exists):
            await admin.execute(f'DROP DATABASE IF EXISTS "{options.database}" WITH (FORCE)')
            await admin.execute(f'CREATE DATABASE "{options.database}"')
    finally:
        await admin.close()
    try:
        started = time.perf_counter()
        console.print(f"migrating {options.database}")
        await asyncio.to_thread(migrate, url, options.revision)
        if options.reuse and exists:
            connection = await asyncpg.connect(dsn)
            try:
                await connection.execute("ANALYZE")
                counts = await _counts(connection)
            finally:
                await connection.close()
        else:
            console.print(
                f"seeding {options.sizes.quarantine:,} quarantined records, {options.sizes.inbox:,} inbox rows"
            )
            counts = await seed(dsn, options.sizes)
            figures["seed_seconds"] = round(time.perf_counter() - started, 1)
        figures["rows"] = counts
        if options.seed_only:
            console.print(f"seeded {options.database}: {counts}")
            return figures
        found = await samples(dsn)
        tracer = Tracer()
        timings = []
        async with served(url, tracer) as client, heartbeats(dsn):
            for page in pages(found):
                timing = await time_page(client, tracer, page, options.warmup, options.requests)
                console.print(f"  {page.label}: p50 {timing.p50:.1f} ms, p95 {timing.p95:.1f} ms")
                timings.append(timing)
        if options.explain:
            await explain(dsn, timings, options.explain)
            console.print(f"plans written to {options.explain}")
    finally:
        if not (options.keep or options.seed_only):
            admin = await asyncpg.connect(options.admin_url)
            try:
                await admin.execute(f'DROP DATABASE IF EXISTS "{options.database}" WITH (FORCE)')
            finally:
                await admin.close()
    figures["requests_per_page"] = options.requests
    figures["pages"] = {timing.page.label: timing.figures() for timing in timings}
    figures["all_under_200ms"] = all(timing.ok for timing in timings)
    report(timings, counts)
    return figures


def report(timings: Sequence[Timing], counts: dict[str, int]) -> None:
    """The table of every page on stdout."""
    title = f"order-service console: {counts['quarantine']:,} quarantined records, {counts['inbox']:,} inbox rows"
    table = Table(title=title)
    table.add_column("page")
    for column in ("p50 ms", "p95 ms", "max ms", "queries", "db p50 ms"):
        table.add_column(column, justify="right")
    table.add_column("status")
    for timing in timings:
        figures = timing.figures()
        status = ", ".join(map(str, figures["statuses"]))
        table.add_row(
            timing.page.label,
            f"{figures['p50_ms']:.1f}",
            f"{figures['p95_ms']:.1f}" if timing.p95 < LIMIT_MS else f"[red]{figures['p95_ms']:.1f}[/red]",
            f"{figures['max_ms']:.1f}",
            str(figures["queries"]),
            f"{figures['db_p50_ms']:.1f}",
            status if figures["statuses"] == [200] else f"[red]{status}[/red]",
        )
    Console().print(table)


def arguments(argv: Sequence[str]) -> Options:
    """Read the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--admin-url", default="postgresql://postgres@127.0.0.1:55432/postgres", help="libpq URL of the cluster"
    )
    parser.add_argument("--database", default="console_bench", help="the database it creates (and drops)")
    parser.add_argument("--quarantine", type=int, default=100_000, help="quarantined records (default 100,000)")
    parser.add_argument("--inbox", type=int, default=1_000_000, help="inbox rows in all (default 1,000,000)")
    parser.add_argument("--requests", type=int, default=30, help="timed requests per page (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed requests per page first (default 3)")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--reuse", action="store_true", help="measure the kept database again, without seeding")
    parser.add_argument(
        "--revision", help="migrate to this revision, not the head (the pages before a migration; --reuse goes on)"
    )
    parser.add_argument("--seed-only", action="store_true", help="seed and keep the database; measure nothing")
    parser.add_argument("--explain", type=Path, help="write EXPLAIN (ANALYZE, BUFFERS) of every page's SQL here")
    args = parser.parse_args(argv)
    if args.inbox < args.quarantine:
        parser.error("--inbox must be at least --quarantine: every quarantined record has its inbox row")
    return Options(
        admin_url=args.admin_url,
        database=args.database,
        sizes=Sizes(quarantine=args.quarantine, inbox=args.inbox),
        requests=args.requests,
        warmup=args.warmup,
        keep=args.keep,
        reuse=args.reuse,
        revision=args.revision,
        seed_only=args.seed_only,
        explain=args.explain,
    )


def main() -> int:
    """Run the bench; exit 0 only when every page answered 200 within the limit."""
    options = arguments(sys.argv[1:])
    figures = asyncio.run(run(options))
    print(json.dumps(figures))
    return 0 if options.seed_only or figures["all_under_200ms"] else 1


if __name__ == "__main__":
    sys.exit(main())
