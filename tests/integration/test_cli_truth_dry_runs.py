"""A dry run says exactly what its real run does, on items the real run would leave as they are too (contract §10):
the same lines about them and the same exit code, in the CLI and in the console's previews; and every acting
command names its actor (`--actor`) in the audit.

Real PostgreSQL; the CLI runs as a process, the console in this process (tests/integration/test_console_security.py).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from tests.conftest import KAFKA
from tests.integration.test_console_security import (
    CONSUMER,
    EFFECT,
    HEAD,
    OPERATOR_TOKEN,
    Console,
    confirm_form,
    quarantined,
    seed,
    serving,
    session,
)
from tests.support import Finished, Topics, cli, quarantine_as, rows, settings_for

RECORD = "orders/0/5"
EVERY_ROW = (
    "SELECT * FROM quarantine ORDER BY failure_id",
    "SELECT * FROM quarantine_annotations ORDER BY id",
    "SELECT * FROM effects ORDER BY idempotency_key",
    "SELECT * FROM key_blocks ORDER BY ordering_key",
    "SELECT * FROM audit_log ORDER BY id",
)


@pytest.fixture
def settings(database_url: str) -> Settings:
    return settings_for(database_url, KAFKA, Topics("dry"), consumer_name=CONSUMER, ordering="key")


@pytest.fixture
async def console(engine: AsyncEngine, database_url: str) -> AsyncIterator[Console]:
    await seed(engine)
    async with serving(engine, database_url) as served:
        yield served


async def _execute(engine: AsyncEngine, sql: str, **params: Any) -> Any:
    async with engine.begin() as connection:
        result = await connection.execute(text(sql), params)
        return result.scalar() if result.returns_rows else None


async def _effect(engine: AsyncEngine, key: str, state: str, kind: str = "payment.capture") -> None:
    await _execute(
        engine,
        "INSERT INTO effects (idempotency_key, aggregate_id, kind, state, payload, attempts)"
        " VALUES (:key, split_part(:key, '/', 1), :kind, :state, '{}', 1)",
        key=key,
        kind=kind,
        state=state,
    )


async def _resolved_record(engine: AsyncEngine, failure_id: str = RECORD) -> None:
    await quarantine_as(engine, CONSUMER, [quarantined(failure_id)])
    await _execute(engine, "UPDATE quarantine SET status = 'resolved' WHERE failure_id = :f", f=failure_id)


async def _everything(engine: AsyncEngine) -> list[list[dict[str, Any]]]:
    return [await rows(engine, query) for query in EVERY_ROW]


def _refusals(finished: Finished) -> list[str]:
    """The lines about items left as they are: stderr without the count of what is selected."""
    return [line for line in finished.stderr.splitlines() if line.strip() and " selected" not in line]


async def _dry_then_real(engine: AsyncEngine, settings: Settings, *command: str) -> tuple[Finished, Finished]:
    """The dry run (which must change nothing), then the real run, of one command."""
    before = await _everything(engine)
    dry = await cli(settings, *command, "--dry-run", check=False)
    assert await _everything(engine) == before, "the dry run changed something"
    return dry, await cli(settings, *command, "--yes", check=False)


async def test_resolving_a_record_that_is_no_longer_open_fails_alike_in_the_dry_run_and_the_real_run(
    engine: AsyncEngine, settings: Settings
) -> None:
    # Given a record that was resolved already and one that is open
    await _resolved_record(engine)
    await quarantine_as(engine, CONSUMER, [quarantined("orders/0/6", key="K-6")])

    # When an operator dry-runs, then runs, resolving both
    dry, real = await _dry_then_real(
        engine, settings, "quarantine", "resolve", RECORD, "orders/0/6", "--reason", "r", "--actor", "ann"
    )

    # Then both say the resolved one is left as it is, and exit 1; the dry run counts only the open one
    assert (dry.returncode, real.returncode) == (1, 1), dry.stderr + real.stderr
    assert _refusals(dry) == _refusals(real) == [f"{RECORD} is resolved, not open: nothing to resolve"]
    assert "quarantine resolve: 1 records selected: orders/0/6" in dry.stdout
    assert real.stdout.strip() == "orders/0/6: resolved"


async def test_retrying_an_effect_that_did_not_fail_fails_alike_in_the_dry_run_and_the_real_run(
    engine: AsyncEngine, settings: Settings
) -> None:
    # Given a sent capture, and a failed capture whose refund went ahead on its failure
    await _effect(engine, "S-1/payment.capture", "sent")
    await _effect(engine, "F-1/payment.capture", "failed")
    await _effect(engine, "F-1/payment.refund", "sent", kind="payment.refund")

    # When an operator dry-runs, then runs, retrying both
    dry, real = await _dry_then_real(
        engine, settings, "effects", "retry", "S-1/payment.capture", "F-1/payment.capture", "--reason", "r"
    )

    # Then both name each as not retried, with the same words, and exit 1
    assert (dry.returncode, real.returncode) == (1, 1), dry.stderr + real.stderr
    assert _refusals(dry) == _refusals(real)
    assert _refusals(real) == [
        "S-1/payment.capture is sent, not failed: nothing to retry",
        "F-1/payment.capture: not retried: failed, and what waited for it went ahead (F-1/payment.refund is sent)",
    ]


async def test_a_dry_run_that_would_act_on_everything_exits_0_as_its_real_run(
    engine: AsyncEngine, settings: Settings
) -> None:
    # Given an open record and a failed effect
    await quarantine_as(engine, CONSUMER, [quarantined(RECORD)])
    await _effect(engine, "F-2/payment.capture", "failed")

    # When an operator dry-runs, then runs, a note, a resolve and a retry of them
    runs = [
        await _dry_then_real(engine, settings, "quarantine", "annotate", RECORD, "--note", "n"),
        await _dry_then_real(engine, settings, "quarantine", "resolve", RECORD, "--reason", "r"),
        await _dry_then_real(engine, settings, "effects", "retry", "F-2/payment.capture", "--reason", "r"),
    ]

    # Then each dry run and its real run exit 0, with nothing to refuse
    for dry, real in runs:
        assert (dry.returncode, real.returncode) == (0, 0), dry.stderr + real.stderr
        assert _refusals(dry) == _refusals(real) == []


async def test_a_filter_that_selects_nothing_exits_0_saying_so_dry_run_or_not(
    engine: AsyncEngine, settings: Settings
) -> None:
    # Given no open record and no failed effect
    # When an operator resolves by a code and retries by a kind, dry run or not
    runs = [
        await _dry_then_real(
            engine, settings, "quarantine", "resolve", "--error-code", "INVALID_FIELD", "--reason", "r"
        ),
        await _dry_then_real(engine, settings, "effects", "retry", "--kind", "payment.capture", "--reason", "r"),
    ]

    # Then each says nothing was selected, and exits 0
    for dry, real in runs:
        assert (dry.returncode, real.returncode) == (0, 0), dry.stderr + real.stderr
        assert "selected: nothing changed" in dry.stderr
        assert "selected: nothing changed" in real.stderr


async def test_every_acting_command_records_the_actor_it_is_given(engine: AsyncEngine, settings: Settings) -> None:
    # Given an open record holding its key, a failed effect and a set-aside outbox row
    await quarantine_as(engine, CONSUMER, [quarantined(RECORD, key="K-A")])
    await _execute(
        engine,
        "INSERT INTO key_blocks (consumer_name, ordering_key, failure_id, reason) VALUES (:c, 'K-B', 'x/0/1', 'q')",
        c=CONSUMER,
    )
    await _effect(engine, "F-3/payment.capture", "failed")
    row_id = await _execute(
        engine,
        "INSERT INTO outbox (topic, key, headers, payload, set_aside_at, set_aside_code)"
        " VALUES ('t', 'k', '{}', 'x', now(), 'MESSAGE_TOO_LARGE') RETURNING id",
    )

    # When each acting command runs with --actor
    commands = {
        "quarantine.annotate": ("quarantine", "annotate", RECORD, "--note", "n"),
        "quarantine.reveal": ("quarantine", "show", RECORD, "--include-payload"),
        "quarantine.resolve": ("quarantine", "resolve", RECORD, "--reason", "r"),
        "effects.retry": ("effects", "retry", "F-3/payment.capture", "--reason", "r"),
        "parked.release": ("parked", "release", "K-B"),
        "outbox.put_back": ("outbox", "put-back", str(row_id)),
    }
    for action, command in commands.items():
        await cli(settings, *command, "--actor", f"actor-of-{action}")

    # Then each audit row names the actor it was given
    audited = await rows(engine, "SELECT action, actor FROM audit_log ORDER BY id")
    assert audited == [{"action": action, "actor": f"actor-of-{action}"} for action in commands]


# ---------------------------------------------------------------- the console's previews


async def test_the_consoles_resolve_preview_leaves_out_a_resolved_record_in_the_done_pages_words(
    console: Console,
) -> None:
    # Given the head record resolved already, and an operator's session
    await _execute(console.engine, "UPDATE quarantine SET status = 'resolved' WHERE failure_id = :f", f=HEAD)
    csrf = await session(console.client, OPERATOR_TOKEN)
    form = {"csrf": csrf, "failure_id": [HEAD, "orders/0/7"], "consumer": CONSUMER, "reason": "r"}

    # When the operator previews resolving it and an open one, then confirms
    preview = await console.client.post("/actions/resolve", data=form)
    done = await console.client.post("/actions/resolve", data=confirm_form(preview.text))

    # Then the preview counts the open one and says the resolved one stays, as the done page does
    assert re.search(r'id="preview-count">1<', preview.text)
    line = f"{HEAD}: resolved, not open: unchanged"
    assert line in _listed(preview.text, "refused")
    assert _listed(done.text, "outcome") == [line, "orders/0/7: resolved"]


async def test_the_consoles_retry_preview_of_a_sent_effect_affects_nothing_in_the_done_pages_words(
    console: Console,
) -> None:
    # Given the failed effect sent meanwhile, and an operator's session
    await _execute(console.engine, "UPDATE effects SET state = 'sent' WHERE idempotency_key = :k", k=EFFECT)
    csrf = await session(console.client, OPERATOR_TOKEN)

    # When the operator previews its retry
    preview = await console.client.post("/actions/retry", data={"csrf": csrf, "key": EFFECT, "reason": "r"})

    # Then nothing would be affected, no confirmation is offered, and it says why in the done page's words
    assert re.search(r'id="preview-count">0<', preview.text)
    assert 'id="confirm"' not in preview.text
    assert _listed(preview.text, "refused") == [f"{EFFECT}: sent: not retried"]


async def test_the_consoles_release_preview_of_a_key_nothing_holds_affects_nothing(console: Console) -> None:
    # Given an operator's session
    csrf = await session(console.client, OPERATOR_TOKEN)
    before = await _everything(console.engine)

    # When the operator previews, then confirms, releasing a key nothing holds
    form = {"csrf": csrf, "key": "NOPE", "consumer": CONSUMER}
    preview = await console.client.post("/actions/release", data=form)
    done = await console.client.post("/actions/release", data={**form, "confirm": "yes"})

    # Then both say nothing holds it, and nothing changed (not even the audit)
    line = "NOPE: nothing holds it and nothing is parked behind it: unchanged"
    assert re.search(r'id="preview-count">0<', preview.text)
    assert _listed(preview.text, "refused") == [line]
    assert _listed(done.text, "outcome") == [line]
    assert await _everything(console.engine) == before


def _listed(page: str, list_id: str) -> list[str]:
    """The items of the page's list with this id, as text."""
    found = re.search(rf'id="{list_id}">(.*?)</ul>', page, re.S)
    assert found is not None, f"no list {list_id} on the page"
    return [re.sub(r"<[^>]+>", "", item) for item in re.findall(r"<li>(.*?)</li>", found.group(1), re.S)]
