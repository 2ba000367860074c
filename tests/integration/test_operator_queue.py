"""The queue as a queue (issue 14): the true timeline, bulk annotate, audited effect retries, reprocess runs.

Real PostgreSQL, Kafka and the fault-injecting downstream; the CLI runs as a process. Assertions are on rows
(quarantine events, annotations, the audit log, effects) and on what the provider holds.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders.fakes import Downstream
from service.store import quarantine
from tests.support import Topics, cli, eventually, produce, rows, running, scalar, settings_for
from tests.support.effects import effect_settings, reconcile, state_is
from tests.support.orders import placed, shipped


async def _quarantined(engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, count: int) -> list[str]:
    """`count` malformed records on partition 0, quarantined by a real consumer; their failure ids."""
    await produce(kafka, topics.source, [(f"Q-{n}", b"\xff", {}) for n in range(count)], partition=0)
    async with running(settings_for(database_url, kafka, topics), "consumer_loop"):
        await eventually(lambda: scalar(engine, f"SELECT count(*) = {count} FROM quarantine"))
    return [f"{topics.source}/0/{n}" for n in range(count)]


async def test_the_timeline_keeps_every_failure_and_change_in_order_and_rewrites_none(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given a quarantined record that an operator annotates, that fails again under another code, and that
    # is then resolved
    [failure_id] = await _quarantined(engine, database_url, kafka, topics, 1)
    settings = settings_for(database_url, kafka, topics)
    await cli(settings, "quarantine", "annotate", failure_id, "--note", "looks truncated", "--author", "bob")
    async with engine.begin() as connection:
        record = quarantine.RecordKey(settings.consumer_name, failure_id)
        await quarantine.requarantine(connection, record, "SCHEMA_UNSUPPORTED", 1, datetime.now(UTC))
    await cli(settings, "quarantine", "resolve", failure_id, "--reason", "producer fixed", "--author", "eve")

    # When the record is shown
    shown = json.loads((await cli(settings, "quarantine", "show", failure_id, "--json")).stdout)
    human = (await cli(settings, "quarantine", "show", failure_id)).stdout

    # Then every step is there once, in the order it happened, the first code kept as it was
    assert [(e["event"], e["error_code"], e["actor"]) for e in shown["timeline"]] == [
        ("failed", "MALFORMED_PAYLOAD", None),
        ("quarantined", "MALFORMED_PAYLOAD", None),
        ("annotated", None, "bob"),
        ("failed again", "SCHEMA_UNSUPPORTED", None),
        ("quarantined again", "SCHEMA_UNSUPPORTED", None),
        ("resolved", None, "eve"),
    ]
    assert shown["error_code"] == "SCHEMA_UNSUPPORTED"
    lines = human.split("timeline")[1].splitlines()
    assert any("failed (attempt 1, MALFORMED_PAYLOAD)" in line for line in lines)
    assert any("resolved by eve: producer fixed" in line for line in lines)

    # And the history cannot be edited, not even by hand
    with pytest.raises(DBAPIError, match="append-only"):
        async with engine.begin() as connection:
            await connection.execute(text("UPDATE quarantine_events SET event = 'nothing happened'"))


async def test_bulk_annotate_by_code_dry_runs_then_notes_each_record_once_and_audits_it(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given three quarantined records
    ids = await _quarantined(engine, database_url, kafka, topics, 3)
    settings = settings_for(database_url, kafka, topics)
    select = ("quarantine", "annotate", "--error-code", "MALFORMED_PAYLOAD", "--note", "INC-7", "--author", "ann")

    # When the operator dry-runs the selection, runs it unconfirmed, then confirms it
    dry = await cli(settings, *select, "--dry-run")
    unconfirmed = await cli(settings, *select, check=False)
    notes_before = await scalar(engine, "SELECT count(*) FROM quarantine_annotations")
    done = await cli(settings, *select, "--yes", "--json")

    # Then the dry run and the refusal changed nothing, and the confirmed run noted each record once
    assert dry.stdout.startswith("quarantine annotate: 3 records selected: ")
    assert unconfirmed.returncode == 1
    assert "not confirmed" in unconfirmed.stderr
    assert notes_before == 0
    assert sorted(json.loads(done.stdout)["annotated"]) == sorted(ids)
    notes = await rows(engine, "SELECT failure_id, author, note FROM quarantine_annotations ORDER BY failure_id")
    assert [(n["failure_id"], n["author"], n["note"]) for n in notes] == [(one, "ann", "INC-7") for one in sorted(ids)]
    [audit] = await rows(engine, "SELECT actor, action, selection, result FROM audit_log")
    assert (audit["actor"], audit["action"], audit["result"]) == ("ann", "quarantine.annotate", {"annotated": 3})
    assert audit["selection"]["error_code"] == "MALFORMED_PAYLOAD"


async def test_a_declined_capture_retried_by_an_operator_is_captured_once_and_the_retry_is_audited(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a capture that failed (the card was declined), and a card that is good now
    key = "RT-1/payment.capture"
    downstream.decline_order("RT-1")
    settings = effect_settings(database_url, kafka, topics, downstream)
    await produce(kafka, topics.source, [("RT-1", placed("RT-1"), {})], partition=0)
    async with running(settings, "consumer_loop", "effect_worker"):
        await eventually(lambda: state_is(engine, key, "failed"))
    downstream.decline_order("RT-1", declined=False)

    # When an operator dry-runs the retry by kind, then retries it, and the worker runs
    dry = await cli(settings, "effects", "retry", "--kind", "payment.capture", "--reason", "card ok", "--dry-run")
    pending_after_dry_run = await state_is(engine, key, "pending")
    retried = await cli(settings, "effects", "retry", key, "--reason", "card updated", "--author", "ops")
    async with running(settings, "effect_worker"):
        await eventually(lambda: state_is(engine, key, "sent"))

    # Then the dry run changed nothing, the retry made one payment, and the audit says who and why
    assert "effects retry: 1 effects selected: RT-1/payment.capture" in dry.stdout + dry.stderr
    assert not pending_after_dry_run
    assert f"{key}: pending" in retried.stdout
    assert len(downstream.payments()) == 1
    assert await scalar(engine, "SELECT details->>'payment_status' FROM orders WHERE order_id = 'RT-1'") == "captured"
    [audit] = await rows(engine, "SELECT actor, action, selection, result FROM audit_log")
    assert (audit["actor"], audit["action"]) == ("ops", "effects.retry")
    assert audit["selection"]["reason"] == "card updated"
    assert audit["result"] == {"retried": {key: "pending"}, "skipped": 0}


async def test_a_failed_email_retried_is_looked_up_first_and_sent_exactly_once(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given an email the provider refused (410): failed
    ref = "EM-1/email.shipped"
    downstream.fail_next("emails.post", times=1, status=410)
    settings = effect_settings(database_url, kafka, topics, downstream)
    await produce(kafka, topics.source, [("EM-1", placed("EM-1"), {}), ("EM-1", shipped("EM-1"), {})], partition=0)
    async with running(settings, "consumer_loop", "effect_worker"):
        await eventually(lambda: state_is(engine, ref, "failed"))

    # When an operator retries it (and a second time, which finds nothing to retry), reconcile runs, the worker runs
    retried = await cli(settings, "effects", "retry", ref, "--reason", "template fixed", "--author", "ops")
    uncertain = await state_is(engine, ref, "uncertain")
    twice = await cli(settings, "effects", "retry", ref, "--reason", "again", "--author", "ops", check=False)
    await reconcile(settings)
    async with running(settings, "effect_worker"):
        await eventually(lambda: state_is(engine, ref, "sent"))

    # Then it went through a look-up, not straight to a second call, and exactly one email exists for the ref
    assert "uncertain: the next `order-service reconcile` looks it up" in retried.stdout
    assert uncertain
    assert twice.returncode == 1
    assert "is uncertain, not failed" in twice.stderr
    assert len(downstream.emails(ref)) == 1


async def test_effects_retry_refuses_what_did_not_fail_and_names_what_it_does_not_know(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a capture that was sent
    key = "OK-1/payment.capture"
    settings = effect_settings(database_url, kafka, topics, downstream)
    await produce(kafka, topics.source, [("OK-1", placed("OK-1"), {})], partition=0)
    async with running(settings, "consumer_loop", "effect_worker"):
        await eventually(lambda: state_is(engine, key, "sent"))

    # When an operator asks to retry it and an unknown key, and to retry without a reason
    run = await cli(settings, "effects", "retry", key, "NO-1/payment.capture", "--reason", "x", "--yes", check=False)
    no_reason = await cli(settings, "effects", "retry", key, check=False)

    # Then nothing changed, each is named, and the exit codes say so
    assert run.returncode == 1
    assert f"{key} is sent, not failed: nothing to retry" in run.stderr
    assert "no effect with idempotency key NO-1/payment.capture" in run.stderr
    assert await state_is(engine, key, "sent")
    assert no_reason.returncode == 2
    assert len(downstream.payments()) == 1


async def test_a_record_quarantined_after_retries_has_both_failures_in_its_timeline_with_the_last_code(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given a record quarantined after three attempts (written as a round writes it)
    async with engine.begin() as connection:
        await connection.execute(
            text(
                """
                INSERT INTO quarantine (failure_id, consumer_name, message_id, error_code, owner, envelope, attempts,
                                        first_failed_at, last_failed_at)
                VALUES ('o/0/7', 'c', 'm-7', 'DOWNSTREAM_UNAVAILABLE_EXHAUSTED', 'oncall', '{}', 3,
                        now() - interval '5 minutes', now() - interval '1 minute')
                """
            )
        )

    # When its timeline is read
    events = await rows(engine, "SELECT event, error_code, attempts FROM quarantine_events ORDER BY id")

    # Then the first failure, the last one with its code, and the quarantine are there, in order
    assert [(e["event"], e["error_code"], e["attempts"]) for e in events] == [
        ("failed", None, 1),
        ("failed", "DOWNSTREAM_UNAVAILABLE_EXHAUSTED", 3),
        ("quarantined", "DOWNSTREAM_UNAVAILABLE_EXHAUSTED", 3),
    ]


async def _effect_row(engine: AsyncEngine, key: str, kind: str, state: str) -> None:
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO effects (idempotency_key, aggregate_id, kind, state, payload, attempts)"
                " VALUES (:key, split_part(:key, '/', 1), :kind, :state, '{}', 1)"
            ),
            {"key": key, "kind": kind, "state": state},
        )


@pytest.mark.parametrize(
    ("refund_state", "retried"),
    [("failed", False), ("in_flight", False), ("sent", False), ("pending", True)],
)
async def test_a_capture_is_retried_only_while_its_refund_still_waits_for_it(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, refund_state: str, retried: bool
) -> None:
    # Given a failed capture, and its order's refund in some state (failed: it found no capture and gave up)
    await _effect_row(engine, "CR-1/payment.capture", "payment.capture", "failed")
    await _effect_row(engine, "CR-1/payment.refund", "payment.refund", refund_state)
    settings = settings_for(database_url, kafka, topics)

    # When an operator retries the capture
    run = await cli(
        settings, "effects", "retry", "CR-1/payment.capture", "--reason", "card ok", "--author", "ops", check=False
    )

    # Then it is retried only if the refund still waits (and so will wait for the retried capture)
    state = await scalar(engine, "SELECT state FROM effects WHERE idempotency_key = 'CR-1/payment.capture'")
    if retried:
        assert run.returncode == 0, run.stderr
        assert state == "pending"
    else:
        assert run.returncode == 1
        assert f"what waited for it went ahead (CR-1/payment.refund is {refund_state})" in run.stderr
        assert state == "failed"


async def test_revealing_a_payload_is_audited_and_showing_without_it_is_not(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given a quarantined record
    [failure_id] = await _quarantined(engine, database_url, kafka, topics, 1)
    settings = settings_for(database_url, kafka, topics)

    # When an operator shows it, then reveals its payload as text
    await cli(settings, "quarantine", "show", failure_id)
    await cli(settings, "quarantine", "show", failure_id, "--payload-as-text", "--author", "rita")

    # Then exactly the reveal is audited, with who and what
    audits = await rows(engine, "SELECT actor, action, selection FROM audit_log")
    assert [(a["actor"], a["action"], a["selection"]) for a in audits] == [
        (
            "rita",
            "quarantine.reveal",
            {"consumer": settings.consumer_name, "failure_id": failure_id, "as": ["text"], "via": "cli"},
        )
    ]
