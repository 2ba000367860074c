"""The effects ledger: external calls recorded in the business transaction, executed later.

Claiming is by state with FOR UPDATE SKIP LOCKED and a lease, never by an id cursor; a worker that dies
leaves its claim behind, and the reconciler takes it back when the lease has expired.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.policy import repairs
from service.policy.effects import EffectDecision
from service.store.recordset import Columns

STATES = ("pending", "in_flight", "sent", "uncertain", "failed")  # what an effect's `state` may be
RESOLVED = frozenset({"sent", "failed"})  # an effect that waits for one (EffectSpec.waits_for) waits for these


@dataclass(frozen=True)
class EffectRow:
    """An effect as the worker and the reconciler see it."""

    idempotency_key: str
    aggregate_id: str
    kind: str
    payload: dict[str, Any]
    attempts: int
    reconcile_count: int
    prerequisite_state: str | None  # the state of the effect this one waits for (EffectSpec.waits_for), if any
    # The span context (`traceparent`) of what it continues, while tracing: as claimed, the attempt that wrote it; once
    # called or looked up, that call's span, which what its outcome writes (events) carries in turn.
    trace_context: str | None = None


# New effects (domain `Effect` values) as a recordset for `ADD_ROWS`.
class NewEffect(NamedTuple):
    """A domain's effect as a round records it, with the span context of the attempt that caused it (a tuple: one
    is made per effect, where a frozen dataclass costs several times as much)."""

    idempotency_key: str
    aggregate_id: str
    kind: str
    payload: Any
    trace_context: str | None = None

    @classmethod
    def of(cls, effect: Any, trace_context: str | None) -> NewEffect:
        """A domain's effect (idempotency_key, aggregate_id, kind, payload) with its span context."""
        return cls(effect.idempotency_key, effect.aggregate_id, effect.kind, effect.payload, trace_context)


COLUMNS = Columns(
    ("idempotency_key", "text"),
    ("aggregate_id", "text"),
    ("kind", "text"),
    ("payload", "jsonb"),
    ("trace_context", "text"),
)


# Records effects as `pending`, part of a round's one write statement (service/store/batch.py); an idempotency
# key that exists already keeps its row.
ADD_ROWS = f"""
    INSERT INTO effects (idempotency_key, aggregate_id, kind, payload, trace_context)
    SELECT idempotency_key, aggregate_id, kind, payload, trace_context FROM ({COLUMNS.select("effect_rows")}) AS v
    ON CONFLICT (idempotency_key) DO NOTHING"""


# Which kinds wait for which (EffectSpec.waits_for) arrive as two parallel arrays, :dependent and :prerequisite.
_PREREQUISITE_STATE = """
    (SELECT c.state FROM unnest(CAST(:dependent AS text[]), CAST(:prerequisite AS text[])) AS d(kind, first)
     JOIN effects c ON c.aggregate_id = e.aggregate_id AND c.kind = d.first WHERE d.kind = e.kind) AS prerequisite_state
"""

_CLAIM = text(
    f"""
    UPDATE effects e
    SET state = 'in_flight', lease_owner = :owner, lease_until = now() + :lease,
        attempts = e.attempts + 1, updated_at = now()
    WHERE e.idempotency_key IN (
        SELECT p.idempotency_key FROM effects p
        WHERE p.state = 'pending' AND p.next_attempt_at <= now()
          -- One kind at a time, whose provider is configured (the others wait, pending, until it is): with the
          -- state and the kind equal, the index hands the due effects over by due time, and the walk stops at the
          -- limit. Several kinds at once made it sort every pending effect of them for each claim.
          AND p.kind = :kind
          -- An effect that waits for another of its aggregate waits until that one is resolved (sent or failed).
          AND NOT EXISTS (
                SELECT 1 FROM unnest(CAST(:dependent AS text[]), CAST(:prerequisite AS text[])) AS d(kind, first)
                JOIN effects c ON c.aggregate_id = p.aggregate_id AND c.kind = d.first
                WHERE d.kind = p.kind AND c.state NOT IN ('sent', 'failed'))
        ORDER BY p.next_attempt_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED)
    RETURNING e.idempotency_key, e.aggregate_id, e.kind, e.payload, e.attempts, e.reconcile_count, e.trace_context,
              {_PREREQUISITE_STATE}
    """
)


def _row(row: Any) -> EffectRow:
    return EffectRow(
        row.idempotency_key,
        row.aggregate_id,
        row.kind,
        dict(row.payload),
        row.attempts,
        row.reconcile_count,
        row.prerequisite_state,
        row.trace_context,
    )


async def claim(
    connection: AsyncConnection,
    owner: str,
    lease: timedelta,
    limit: int,
    kind: str,
    waits: Sequence[tuple[str, str]] = (),
) -> list[EffectRow]:
    """Lease up to `limit` due pending effects of this kind to `owner`, the earliest due first; a kind in `waits`
    (kind, the kind it waits for) is claimed only once that one of the same aggregate is resolved."""
    result = await connection.execute(
        _CLAIM,
        {
            "owner": owner,
            "lease": lease,
            "limit": limit,
            "kind": kind,
            "dependent": [dependent for dependent, _ in waits],
            "prerequisite": [first for _, first in waits],
        },
    )
    return [_row(row) for row in result]


@dataclass  # not frozen (slower to build): one per effect on the worker's path
class Settlement:
    """An effect's next state, written only if the effect is still `from_state` (and leased to `owner`), at the
    attempt it was read at: one worker's lanes share its owner, and a claim whose lease ran out may find its
    effect claimed again by another of them (one more attempt) when its outcome comes."""

    key: str
    from_state: str
    owner: str | None
    attempts: int
    state: str
    reference: str | None
    code: str | None
    retry_ms: int
    reconciled: int  # 1: a look-up sent an uncertain effect back to pending, one more reconcile spent
    unmade: int  # 1: the claim counted an attempt in advance and no call was made; it is given back

    @staticmethod
    def of(key: str, decision: EffectDecision, *, from_state: str, owner: str | None, attempts: int) -> Settlement:
        """The settlement a decision makes of an effect that was `from_state` at `attempts`."""
        retry_in = decision.retry_in or timedelta(0)
        return Settlement(
            key,
            from_state,
            owner,
            attempts,
            decision.state,
            decision.reference,
            decision.code.value if decision.code else None,
            round(retry_in.total_seconds() * 1000),
            1 if from_state == "uncertain" and decision.state == "pending" else 0,
            1 if decision.unmade and from_state == "in_flight" else 0,
        )


SETTLEMENTS = Columns(
    ("key", "text"),
    ("from_state", "text"),
    ("owner", "text"),
    ("attempts", "int"),
    ("state", "text"),
    ("reference", "text"),
    ("code", "text"),
    ("retry_ms", "bigint"),
    ("reconciled", "int"),
    ("unmade", "int"),
)
# A batch's outcomes in one statement; the rows come locked in key order, so two batches never wait on each
# other in a cycle.
_SETTLE = text(
    f"""
    WITH s AS MATERIALIZED ({SETTLEMENTS.select("settlements")}),
    -- `IS NOT DISTINCT FROM`, never null here, is `=` that no index serves: each effect is found by its key, not by
    -- a walk of every effect in its state (which the planner prefers while the statistics take the table for small).
    mine AS MATERIALIZED (
        SELECT s.* FROM effects e JOIN s ON e.idempotency_key = s.key
        WHERE e.state IS NOT DISTINCT FROM s.from_state AND (s.owner IS NULL OR e.lease_owner = s.owner)
          AND e.attempts = s.attempts
        ORDER BY e.idempotency_key FOR UPDATE OF e)
    UPDATE effects e
    SET state = mine.state,
        provider_ref = COALESCE(mine.reference, e.provider_ref),
        last_error_code = mine.code,
        next_attempt_at = now() + mine.retry_ms * interval '1 millisecond',
        reconcile_count = e.reconcile_count + mine.reconciled,
        attempts = e.attempts - mine.unmade,
        lease_owner = NULL, lease_until = NULL, updated_at = now()
    FROM mine
    WHERE e.idempotency_key = mine.key AND e.state IS NOT DISTINCT FROM mine.from_state
      AND (mine.owner IS NULL OR e.lease_owner = mine.owner) AND e.attempts = mine.attempts
    RETURNING e.idempotency_key
    """
)


# A batch's outcomes join a few hundred keys to tables that grow by thousands of rows a second. Until a table's
# first ANALYZE (a new database, a sudden load) the planner takes it for small, and hash-joins the batch to a
# sequential scan of the whole table, twice a statement, for every batch: the outcome transaction took longer than
# the calls (docs/performance.md). With hash and merge joins off, a join is a loop of primary-key look-ups,
# whatever the statistics say. The penalty cost of a plan that can only hash would put it past JIT compilation, which
# costs more than such a statement: JIT is off too. For the caller's transaction only.
_JOIN_BY_KEY = text(
    "SELECT set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true),"
    " set_config('jit', 'off', true)"
)


async def join_by_key(connection: AsyncConnection) -> None:
    """Make the rest of the caller's transaction join by key look-ups (nested loops), whatever the statistics."""
    await connection.execute(_JOIN_BY_KEY)


async def settle_all(connection: AsyncConnection, settlements: Sequence[Settlement]) -> set[str]:
    """Move effects to their next states, each only if it is still where we left it; return the keys that moved
    (the others moved meanwhile: another process owns them now)."""
    if not settlements:
        return set()
    result = await connection.execute(_SETTLE, {"settlements": SETTLEMENTS.encode(settlements)})
    return set(result.scalars())


# An effect that waits for another of its aggregate (EffectSpec.waits_for) becomes claimable when that one is
# resolved: an update, which notifies nobody (migration 0014's trigger is on inserts). The transaction that resolves
# it notifies the effects' channel once per kind that has pending effects of those aggregates, with the kind as the
# payload (service/store/wakeups.py); a kind name too long for a payload wakes every lane, as the trigger does.
_WAKE_WAITING = text(
    """
    SELECT pg_notify(:channel, CASE WHEN octet_length(w.kind) <= 1000 THEN w.kind ELSE '' END)
    FROM (SELECT DISTINCT e.kind FROM effects e
          WHERE e.aggregate_id = ANY(CAST(:aggregates AS text[])) AND e.kind = ANY(CAST(:kinds AS text[]))
            AND e.state = 'pending') AS w
    """
)


async def wake_waiting(
    connection: AsyncConnection, channel: str, aggregates: Collection[str], kinds: Collection[str]
) -> None:
    """At the commit of the caller's transaction, wake the lanes of these kinds if effects of theirs are pending for
    these aggregates (their prerequisite was just resolved)."""
    await connection.execute(_WAKE_WAITING, {"channel": channel, "aggregates": list(aggregates), "kinds": list(kinds)})


_EXPIRE_LEASES = text(
    """
    UPDATE effects SET state = 'uncertain', last_error_code = 'OUTCOME_UNKNOWN',
                       lease_owner = NULL, lease_until = NULL, updated_at = now()
    WHERE state = 'in_flight' AND lease_until < now()
    RETURNING idempotency_key
    """
)


async def expire_leases(connection: AsyncConnection) -> list[str]:
    """Claims whose lease ran out (the worker died mid-call) become uncertain: only a look-up can tell."""
    return list((await connection.execute(_EXPIRE_LEASES)).scalars())


_UNCERTAIN = text(
    f"""
    SELECT e.idempotency_key, e.aggregate_id, e.kind, e.payload, e.attempts, e.reconcile_count, e.trace_context,
           {_PREREQUISITE_STATE}
    FROM effects e WHERE e.state = 'uncertain' ORDER BY e.updated_at LIMIT :limit
    """
)


async def uncertain(connection: AsyncConnection, limit: int, waits: Sequence[tuple[str, str]] = ()) -> list[EffectRow]:
    """Uncertain effects, oldest first (`waits` as for `claim`, for their prerequisite's state)."""
    result = await connection.execute(
        _UNCERTAIN,
        {"limit": limit, "dependent": [kind for kind, _ in waits], "prerequisite": [first for _, first in waits]},
    )
    return [_row(row) for row in result]


# Fixed SQL whatever the filters: the kind's and the time range's filters are off when their parameter is NULL.
_FILTERS = """
    state = ANY(CAST(:states AS text[])) AND (CAST(:kind AS text) IS NULL OR kind = :kind)
    AND (CAST(:since AS timestamptz) IS NULL OR updated_at >= :since)
    AND (CAST(:until AS timestamptz) IS NULL OR updated_at < :until)
"""
_LISTING = text(
    f"""
    SELECT idempotency_key, aggregate_id, kind, state, attempts, reconcile_count, last_error_code, provider_ref,
           next_attempt_at, created_at, updated_at
    FROM effects WHERE {_FILTERS} ORDER BY created_at, idempotency_key LIMIT :limit OFFSET :offset
    """
)
_COUNT = text(f"SELECT count(*) FROM effects WHERE {_FILTERS}")


async def listing(
    connection: AsyncConnection,
    states: Sequence[str],
    *,
    kind: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[dict[str, Any]], int]:
    """Effects in these states (last changed in [since, until) when given), oldest first: one page of them, and how
    many match in all."""
    # An empty kind is no filter.
    params = {
        "states": list(states),
        "kind": kind or None,
        "since": since,
        "until": until,
        "limit": limit,
        "offset": offset,
    }
    rows = [dict(row._mapping) for row in await connection.execute(_LISTING, params)]
    total = (await connection.execute(_COUNT, params)).scalar_one()
    return rows, int(total)


_GET = text(
    """
    SELECT idempotency_key, aggregate_id, kind, state, payload, attempts, reconcile_count, provider_ref,
           last_error_code, lease_owner, lease_until, next_attempt_at, created_at, updated_at
    FROM effects WHERE idempotency_key = :key
    """
)


async def get(connection: AsyncConnection, key: str) -> dict[str, Any] | None:
    """One effect, every column, by its idempotency key."""
    row = (await connection.execute(_GET, {"key": key})).first()
    return dict(row._mapping) if row is not None else None


# The named effects (an absent key names none): what a retry finds, and what its dry run reports.
_NAMED = "SELECT idempotency_key, kind, state FROM effects WHERE idempotency_key = ANY(CAST(:keys AS text[]))"
_LOCK_FOR_RETRY = text(_NAMED + " ORDER BY idempotency_key FOR UPDATE")
# The effects of the retried one's aggregate whose kinds (`:kinds`) wait for its kind (locked for a real run).
_DEPENDENTS = (
    "SELECT d.idempotency_key, d.state FROM effects d JOIN effects f USING (aggregate_id)"
    " WHERE f.idempotency_key = :key AND d.kind = ANY(CAST(:kinds AS text[]))"
    " ORDER BY d.idempotency_key"
)
_LOCK_DEPENDENTS = text(_DEPENDENTS + " FOR UPDATE OF d")
_RETRY = text(
    """
    UPDATE effects SET state = :state, attempts = 0, reconcile_count = 0, lease_owner = NULL,
           lease_until = NULL, next_attempt_at = now(), updated_at = now()
    WHERE idempotency_key = :key
    """
)


async def states(connection: AsyncConnection, keys: Sequence[str]) -> dict[str, str]:
    """The state of each named effect; a key that names no effect is absent."""
    rows = await connection.execute(text(_NAMED), {"keys": list(keys)})
    return {row.idempotency_key: row.state for row in rows.all()}


async def retry_plan(
    connection: AsyncConnection,
    keys: Sequence[str],
    goes_to: Callable[[str], str],
    waiting: Mapping[str, Sequence[str]] | None = None,
    *,
    lock: bool,
) -> dict[str, tuple[str | None, str | None]]:
    """What an operator's retry of these effects does (repairs.effect_retry): per key, what it was (None: no such
    effect) and the state it goes to (None: left as it is). `lock`: the rows are locked until the transaction ends
    (a real run, which then applies the plan); a dry run reads them as they are.

    `waiting` gives, per kind, the kinds that wait for it (an undo for the call it undoes). Their rows are locked
    with the retried one's, so no worker claims them between the decision and its application.
    """
    found: dict[str, tuple[str | None, str | None]] = {key: (None, None) for key in keys}
    rows = await connection.execute(_LOCK_FOR_RETRY if lock else text(_NAMED), {"keys": list(keys)})
    for row in rows.all():
        moved: list[str] = []
        dependents = list((waiting or {}).get(row.kind, ()))
        if row.state == "failed" and dependents:
            statement = _LOCK_DEPENDENTS if lock else text(_DEPENDENTS)
            ahead = (await connection.execute(statement, {"key": row.idempotency_key, "kinds": dependents})).all()
            moved = [f"{other.idempotency_key} is {other.state}" for other in ahead if other.state != "pending"]
        found[row.idempotency_key] = repairs.effect_retry(row.state, goes_to(row.kind), moved)
    return found


async def retry(
    connection: AsyncConnection,
    keys: Sequence[str],
    goes_to: Callable[[str], str],
    waiting: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, tuple[str | None, str | None]]:
    """An operator's retry of failed effects, as `retry_plan` decides it: each goes where `goes_to(kind)` says
    (`pending` or `uncertain`, effect_kinds.retry_state), with a fresh budget of attempts and look-ups, due now."""
    plan = await retry_plan(connection, keys, goes_to, waiting, lock=True)
    for key, (_, state) in plan.items():
        if state is not None:
            await connection.execute(_RETRY, {"state": state, "key": key})
    return plan
