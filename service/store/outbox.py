"""The outbox: messages written in the business transaction, published later by the relay."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from operator import attrgetter
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.policy.headers import Headers, from_json
from service.policy.records import unpack_key
from service.store.recordset import Columns
from service.store.uow import translated_errors


@dataclass(slots=True)  # not frozen (slower to build): one is built per event
class OutboxMessage:
    """One message to publish."""

    topic: str
    key: str | None
    # Our own headers as {name: text}; a copy's original headers as `service.policy.headers.to_json` stores them.
    headers: dict[str, str] | list[list[str]]
    payload: bytes | None  # exactly one of `payload` and `text` is set (neither: the insert fails, NOT NULL)
    # A copy's original Kafka key, exactly (`service.policy.records.pack_key`); None: publish `key` as UTF-8.
    # `key` stays the ordering key the relay keeps each key's rows in order by.
    kafka_key: bytes | None = None
    # A JSON document's text, published as its UTF-8 bytes: it travels in the round's recordset as a JSON string,
    # where bytes travel as base64 (docs/performance.md, "One statement, one transaction per round"). The database
    # must be UTF8.
    text: str | None = None
    # The span context (`traceparent`) of what wrote it, while tracing: the relay's `send` span continues it.
    trace_context: str | None = None

    @property
    def value(self) -> bytes:
        """The bytes published, as the insert takes them: `text` as UTF-8, else `payload`."""
        if self.text is not None:
            return self.text.encode()
        assert self.payload is not None, "an outbox message has a payload or a text"
        return self.payload

    @staticmethod
    def json(
        topic: str, key: str | None, headers: dict[str, str], document: dict[str, Any], trace_context: str | None = None
    ) -> OutboxMessage:
        """A message whose value is a compact JSON document."""
        return OutboxMessage(topic, key, headers, None, None, orjson.dumps(document).decode(), trace_context)


@dataclass(slots=True)  # not frozen (slower to build): one is built per row claimed
class ClaimedRow:
    """An unpublished row this relay holds the lock of."""

    id: int
    topic: str
    key: str | None  # the ordering key: a key's rows are published in id order
    headers: Headers
    payload: bytes
    # What goes out as the Kafka key: a copy's original bytes (null included), else the ordering key as UTF-8.
    kafka_key: bytes | None
    # The span context (`traceparent`) of what wrote it, while tracing: the relay's `send` span continues it.
    trace_context: str | None = None
    # A copy of a producer's record (a tier's, a reprocess or an edit's: the rows with the original Kafka key), whose
    # headers go out byte-exact; else a message the service wrote itself (an event, a rejection, an envelope).
    copy: bool = False

    @property
    def size(self) -> int:
        """The bytes of the payload and the headers, before compression."""
        return len(self.payload) + sum(len(name.encode()) + len(value) for name, value in self.headers)


async def add(connection: AsyncConnection, messages: Sequence[OutboxMessage]) -> list[int]:
    """Add messages in the caller's transaction; return their row ids."""
    if not messages:
        return []
    result = await connection.execute(_ADD, {"outbox_rows": COLUMNS.encode(messages)})
    return [row.id for row in result]


# Also part of a round's one write statement (service/store/batch.py).
COLUMNS = Columns(
    ("topic", "text"),
    ("key", "text"),
    ("headers", "jsonb"),
    ("payload", "bytea"),
    ("kafka_key", "bytea"),
    ("text", "text"),
    ("trace_context", "text"),
)
ADD_ROWS = f"""
    INSERT INTO outbox (topic, key, headers, payload, kafka_key, trace_context)
    SELECT topic, key, headers, COALESCE(convert_to(text, 'UTF8'), payload), kafka_key, trace_context
    FROM ({COLUMNS.select("outbox_rows")}) AS v"""
_ADD = text(ADD_ROWS + "\n    RETURNING id")


# Relays divide the keys among themselves by the hash of the key: each claims only rows of the slots it holds (a
# session advisory lock per slot, see `Slots`), so two relays do not hold rows of one key. A row without a key
# has no order to keep and goes to any relay.
SLOTS = 64
_SLOT_OF_KEY = f"abs(hashtext(key) % {SLOTS})"
# A key's rows are kept only up to its first unpublished row the claim passed without taking (held by another
# transaction): a slot changes hands while its last holder's transaction may still hold rows (it crashed, or lost
# its session), and a relay without slots (an older version) claims any key. The rows not kept stay locked until the
# claiming transaction ends. In one statement: no round trip.
#
# `held` reads the claimed keys' unpublished rows below the last one taken that were not taken (held by another
# transaction, or of a key in flight or of another relay's slot), the first of each key, and is joined to the
# claimed rows by hash. `key = ANY(ARRAY(…))` lets the (key, id) index serve it. Walking the id range instead, the
# planner could take the primary key (with statistics taken while every row was unpublished it cannot tell it from
# the unpublished rows' index) and read every row published before the claim. With statistics taken while the relay
# kept up it may still walk the unpublished rows' index by id; the hashed `NOT (key NOT IN (…))` then rejects the
# other keys' rows first (an array from a subquery is never hashed: it was compared with each row walked). A look-up
# per claimed row left the planner a choice of index per row, and behind a backlog it walked every earlier row of
# any key for each row claimed (docs/performance.md).
#
# The keys in flight (`busy`) are looked up in a hash of them (`NOT IN (SELECT unnest(…))`): `key <> ALL(…)` is
# hashed only in a custom plan, and after five claims a connection's cache may hold the generic one, which compares
# each row walked with every key in flight (docs/performance.md). The hash is built only if it fits in `work_mem`
# (times `hash_mem_multiplier`): `_INDEX_WALK` gives the claim room for five batches of the largest batch size.
#
# Rows of the topics in `:missing` (the broker answers and has no such topic, and does not create it) are neither
# claimed nor held: they wait for their topic, and their keys' rows of other topics go on, as behind a set-aside row.
#
# A claim also stops once `max_bytes` of payloads, headers and keys came before a row (the first row always goes,
# and the row that crosses the bound goes too): the relay holds its batches in flight in memory, and an outbox row
# may hold up to 32 MiB (the copy of a source record the broker took compressed: MAX_UNCOMPRESSED_MESSAGE). The rows
# past it stay locked, unread, until the transaction ends; a cut in id order keeps each key's order, as the `held`
# rows do.
_CLAIM = text(
    f"""
    WITH claimed AS (
        SELECT id, topic, key, CAST(headers AS text) AS headers, payload, kafka_key, trace_context FROM outbox
        WHERE published_at IS NULL AND set_aside_at IS NULL AND NOT (topic = ANY(CAST(:missing AS text[])))
          AND (key IS NULL OR {_SLOT_OF_KEY} = ANY(CAST(:slots AS int[]))
                               AND key NOT IN (SELECT unnest(CAST(:busy AS text[]))))
        ORDER BY id LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ),
    held AS (
        SELECT key, min(id) AS first_id FROM outbox
        WHERE published_at IS NULL AND set_aside_at IS NULL AND key = ANY(ARRAY(SELECT key FROM claimed))
          AND NOT (topic = ANY(CAST(:missing AS text[])))
          AND NOT (key NOT IN (SELECT key FROM claimed WHERE key IS NOT NULL))
          AND id < (SELECT max(id) FROM claimed) AND id NOT IN (SELECT id FROM claimed)
        GROUP BY key
    )
    SELECT id, topic, key, headers, payload, kafka_key, trace_context, upto FROM (
        SELECT c.*, sum(c.size) OVER (ORDER BY c.id) AS upto
        FROM (SELECT claimed.*, octet_length(payload) + octet_length(headers)
                     + coalesce(octet_length(kafka_key), octet_length(key), 0) AS size FROM claimed) AS c
        LEFT JOIN held AS h ON h.key = c.key
        WHERE h.first_id IS NULL OR c.id < h.first_id
    ) AS kept
    WHERE upto - size < :max_bytes
    """
)


# Before the table's first ANALYZE (a new database, a sudden backlog) the planner takes the unpublished rows for a
# handful, and sorts them all for every batch; a walk of the partial index in id order stops at the limit whatever
# the statistics say. For the same reason the claim's `held` rows are read by index and joined by hash, never by a
# loop over the claimed rows. These plans' cost is past the threshold of JIT compilation, which costs more than the
# claim: off too. And room for the hash of the keys in flight: five batches of 10,000 keys of up to 512 bytes each
# (the largest ORDERS_RELAY_BATCH_SIZE and ordering key). All for the claiming transaction only.
_INDEX_WALK = text(
    "SELECT set_config('enable_sort', 'off', true), set_config('enable_seqscan', 'off', true),"
    " set_config('enable_nestloop', 'off', true), set_config('jit', 'off', true),"
    " set_config('work_mem', '32MB', true)"
)
_UNPUBLISHED = text("SELECT id FROM outbox WHERE published_at IS NULL AND id = ANY(CAST(:ids AS bigint[]))")
_MARK = text("UPDATE outbox SET published_at = now() WHERE id = ANY(CAST(:ids AS bigint[]))")
_SET_ASIDE = text(
    "UPDATE outbox SET set_aside_at = now(), set_aside_code = :code WHERE id = ANY(CAST(:ids AS bigint[]))"
)
_SET_ASIDE_ROWS = text(
    """
    SELECT id, topic, key, set_aside_code AS code, set_aside_at, created_at, length(payload) AS payload_bytes
    FROM outbox WHERE set_aside_at IS NOT NULL AND published_at IS NULL ORDER BY id LIMIT :limit
    """
)
_PUT_BACK = text(
    "UPDATE outbox SET set_aside_at = NULL, set_aside_code = NULL"
    " WHERE id = :id AND set_aside_at IS NOT NULL AND published_at IS NULL"
)
_IS_SET_ASIDE = text(
    "SELECT EXISTS (SELECT FROM outbox WHERE id = :id AND set_aside_at IS NOT NULL AND published_at IS NULL)"
)


# What one claim's rows may hold, payloads, headers and keys: five batches in flight hold at most 80 MiB and five rows.
CLAIM_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Claim:
    """The rows one claim locked and took, and whether it stopped at its limit (more rows may be waiting)."""

    rows: list[ClaimedRow]
    full: bool


async def claim(
    connection: AsyncConnection,
    limit: int,
    slots: Collection[int],
    busy: Collection[str] = (),
    max_bytes: int = CLAIM_BYTES,
    missing: Collection[str] = (),
) -> Claim:
    """Lock up to `limit` unpublished rows of keys in `slots` (and rows without a key), taking rows while fewer than
    `max_bytes` of payloads, headers and keys came before them (so at least one), skipping rows another transaction
    holds, the keys in `busy` and the topics in `missing`, and keep per-key order.

    Claiming is by state (`published_at IS NULL`), never by an id cursor: ids commit out of order. `busy` names
    the keys of the caller's batch still in flight, so that a second open transaction does not lock their later
    rows (which it could not publish before the first commits).
    """
    await connection.execute(_INDEX_WALK)
    parameters = {
        "limit": limit,
        "slots": list(slots),
        "busy": list(busy),
        "max_bytes": max_bytes,
        "missing": list(missing),
    }
    result = (await connection.execute(_CLAIM, parameters)).all()
    rows = [
        ClaimedRow(
            row_id,
            topic,
            key,
            from_json(orjson.loads(headers)),
            payload,
            (unpack_key(kafka_key) if kafka_key is not None else key.encode() if key is not None else None),
            trace_context,
            kafka_key is not None,
        )
        for row_id, topic, key, headers, payload, kafka_key, trace_context, _ in result
    ]
    rows.sort(key=_BY_ID)  # (they come in id order: the statement just does not promise it)
    # `upto`: the bytes of the rows kept up to each one, in id order; the last row's reaching `max_bytes` means the
    # rows kept after it (if any) were cut.
    return Claim(rows, len(rows) == limit or max((upto for *_, upto in result), default=0) >= max_bytes)


_BY_ID = attrgetter("id")


# Session advisory locks (two int4 keys, as pg_locks shows them): one per relay that is up, and one per slot held.
_MEMBERS = "hashtext('outbox-relay')"
_SLOT_LOCK = "hashtext('outbox-relay-slot')"
_JOIN = text(f"SELECT pg_advisory_lock({_MEMBERS}, pg_backend_pid())")
_RELAYS_UP = text(
    f"""
    SELECT count(*) FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND classid = CAST({_MEMBERS} AS oid)
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
    """
)
_TAKE = text(f"SELECT slot FROM unnest(CAST(:slots AS int[])) AS slot WHERE pg_try_advisory_lock({_SLOT_LOCK}, slot)")
_RELEASE = text(f"SELECT pg_advisory_unlock({_SLOT_LOCK}, slot) FROM unnest(CAST(:slots AS int[])) AS slot")


class Slots:
    """The key-hash slots a relay claims rows of, as session advisory locks on a connection of its own.

    The relays that are up share the slots out: each holds at most ceil(SLOTS / relays) and takes free ones
    below that, so every slot finds a holder, and a relay that stops or dies frees its slots with its session.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._connection: AsyncConnection | None = None
        self.held: frozenset[int] = frozenset()

    async def __aenter__(self) -> Slots:
        async with translated_errors():
            self._connection = await self._engine.connect()
        try:
            async with translated_errors():
                # Autocommit: the locks outlive transactions, and the session must not sit idle in one.
                await self._connection.execution_options(isolation_level="AUTOCOMMIT")
                await self._connection.execute(_JOIN)
            await self.rebalance()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def rebalance(self) -> None:
        """Take free slots up to this relay's share, and give back what is above it.

        The caller gives a slot back only while it holds no row of it: it publishes nothing while this runs.
        """
        connection = self._connection
        assert connection is not None, "use Slots inside `async with`"
        async with translated_errors():
            relays = max(1, int(await connection.scalar(_RELAYS_UP) or 1))
            share = -(-SLOTS // relays)
            held = set(self.held)
            if len(held) < share:
                free = [slot for slot in range(SLOTS) if slot not in held]
                held.update(slot for (slot,) in await connection.execute(_TAKE, {"slots": free}))
            above = sorted(held)[share:]
            if above:
                await connection.execute(_RELEASE, {"slots": above})
                held.difference_update(above)
        self.held = frozenset(held)

    async def __aexit__(self, *exc_info: object) -> None:
        self.held = frozenset()
        if self._connection is not None:
            # Closed, not returned to the pool: the next user of a pooled session would inherit its locks. Quietly:
            # on the way out of a database outage the session is gone with its locks, and an error closing it must
            # not replace the outage the relay waits out (it would end the process).
            with contextlib.suppress(Exception):
                await self._connection.invalidate()
            with contextlib.suppress(Exception):
                await self._connection.close()


async def unpublished(connection: AsyncConnection, ids: Sequence[int]) -> set[int]:
    """Those of `ids` the relay has not published yet."""
    if not ids:
        return set()
    return {row.id for row in await connection.execute(_UNPUBLISHED, {"ids": list(ids)})}


async def mark_published(connection: AsyncConnection, ids: Sequence[int]) -> None:
    """Mark rows published in the claiming transaction."""
    if ids:
        await connection.execute(_MARK, {"ids": list(ids)})


async def set_aside(connection: AsyncConnection, ids: Sequence[int], code: str) -> None:
    """Take claimed rows Kafka refused for their content out of the relay's way, with the reason."""
    if ids:
        await connection.execute(_SET_ASIDE, {"ids": list(ids), "code": code})


@dataclass(frozen=True)
class SetAsideRow:
    """A row the relay set aside, as operators list it (no payload)."""

    id: int
    topic: str
    key: str | None
    code: str
    set_aside_at: datetime
    created_at: datetime
    payload_bytes: int


async def set_aside_rows(connection: AsyncConnection, limit: int = 100) -> list[SetAsideRow]:
    """The rows set aside and not published, oldest first."""
    result = await connection.execute(_SET_ASIDE_ROWS, {"limit": limit})
    return [SetAsideRow(**row._mapping) for row in result]


async def is_set_aside(connection: AsyncConnection, row_id: int) -> bool:
    """Whether a set-aside, unpublished row has this id (what `put_back` would hand to the relay)."""
    return bool((await connection.execute(_IS_SET_ASIDE, {"id": row_id})).scalar())


async def put_back(connection: AsyncConnection, row_id: int) -> bool:
    """Hand a set-aside row to the relay again (after the broker's limit was raised); False if there is none."""
    result = await connection.execute(_PUT_BACK, {"id": row_id})
    return bool(result.rowcount)


# As for the inbox (inbox.purge): small ctid batches, never waiting on a locked row.
_PURGE_PUBLISHED = text(
    """
    DELETE FROM outbox WHERE ctid IN (
        SELECT ctid FROM outbox WHERE published_at < now() - CAST(:older_than AS interval)
        LIMIT :limit FOR UPDATE SKIP LOCKED)
    """
)


async def purge_published(connection: AsyncConnection, older_than: timedelta, limit: int) -> int:
    """Delete up to `limit` rows published more than `older_than` ago; return how many."""
    result = await connection.execute(_PURGE_PUBLISHED, {"older_than": older_than, "limit": limit})
    return int(result.rowcount)
