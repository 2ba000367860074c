"""The console's pure parts (issue 16): who the tokens name, how record content and payloads are shown, the
chart's geometry, the login limit, and when the console refuses to start. No I/O.

Property-based where the input comes from outside (the configuration, a record, a client): on failure
Hypothesis prints the falsifying example and the blob that replays it (`@reproduce_failure`).
"""

from __future__ import annotations

import json
import os
import string
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from service.cli.console import refusal
from service.console.actions import confirm_field, dry_run_list
from service.console.sessions import LoginLimiter
from service.console.views import (
    CHART_HEIGHT,
    CHART_WIDTH,
    HEX_LIMIT,
    TEXT_LIMIT,
    Trace,
    chart,
    payload_view,
    printable,
    trace,
)
from service.console.web import Refused
from service.orders.settings import OrderSettings
from service.policy.operators import MIN_TOKEN_LENGTH, ROLES, Operator, fingerprint, match, parse_tokens

PROPERTY = settings(max_examples=200, deadline=None, database=None, print_blob=True)
BAR_WIDTH = CHART_WIDTH / 24 - 2  # as overview.html draws each bar
ROUNDING = 0.05 * 2  # each bar's top and height are rounded to a tenth

# A token as an operator generates one: any printable character but the list's comma, never at either end a
# space (an entry is trimmed); at least 32 characters. A colon may be inside: only the first two split.
token_characters = st.characters(codec="utf-8", categories=["L", "N", "P", "S"], exclude_characters=",")
tokens = st.text(token_characters, min_size=MIN_TOKEN_LENGTH, max_size=64)
names = st.text(string.ascii_letters + string.digits + "._-", min_size=1, max_size=16)
roles = st.sampled_from(ROLES)


@st.composite
def configurations(draw: st.DrawFn) -> list[tuple[str, str, str]]:
    """A valid `ORDERS_CONSOLE_TOKENS`: distinct names, distinct tokens."""
    entries = draw(
        st.lists(st.tuples(names, roles, tokens), min_size=1, max_size=6, unique_by=(lambda e: e[0], lambda e: e[2]))
    )
    return entries


def written(entries: list[tuple[str, str, str]], spacing: str = "") -> str:
    """Entries as the variable holds them."""
    return ",".join(f"{spacing}{name}:{role}:{token}{spacing}" for name, role, token in entries)


# ---------------------------------------------------------------- tokens


@PROPERTY
@given(entries=configurations(), spacing=st.sampled_from(["", " ", "  "]), empty=st.booleans())
def test_a_valid_token_list_reads_back_as_the_operators_it_names(
    entries: list[tuple[str, str, str]], spacing: str, empty: bool
) -> None:
    # Given a valid list, with spaces around its entries and (maybe) an empty entry at its end
    value = written(entries, spacing) + (",," if empty else "")

    # When it is parsed
    operators = parse_tokens(value)

    # Then each token names its operator, role and fingerprint, and nothing else is there
    assert operators == {token: Operator(name, role, fingerprint(token)) for name, role, token in entries}  # type: ignore[arg-type]


def malformations(name: str, role: str, token: str, short: str, other: str) -> Iterator[tuple[str, str]]:
    """(how, entry list) for each way an entry of `name`, `role` and `token` can be written wrong; `short` is
    a token too short, `other` a second valid token."""
    yield "no token", f"{name}:{role}"
    yield "an empty token", f"{name}:{role}:"
    yield "no name", f":{role}:{token}"
    yield "no role", f"{name}::{token}"
    yield "an unknown role", f"{name}:admin:{token}"
    yield "the role as upper case", f"{name}:{role.upper()}:{token}"
    yield "the token alone", token
    yield "the token too short", f"{name}:{role}:{short}"
    yield "the name twice", f"{name}:{role}:{token},{name}:{role}:{other}"
    yield "the token twice", f"{name}:{role}:{token},{name}x:{role}:{token}"
    yield "token, name, role", f"{token}:{name}:{role}"
    yield "token, role, name", f"{token}:{role}:{name}"
    yield "name, token, role", f"{name}:{token}:{role}"
    yield "role, token, name", f"{role}:{token}:{name}"
    yield "the token twice, without a name", f"{token}:{token}"


@PROPERTY
@given(
    entries=configurations(),
    name=names,
    role=roles,
    token=tokens,
    short=st.text(token_characters, min_size=12, max_size=MIN_TOKEN_LENGTH - 1),
    other=tokens,
    where=st.integers(min_value=0, max_value=6),
)
def test_every_malformed_entry_is_refused_with_a_message_that_holds_no_token(
    entries: list[tuple[str, str, str]], name: str, role: str, token: str, short: str, other: str, where: int
) -> None:
    # Given a valid list with one malformed entry put somewhere in it (its name and tokens its own)
    taken = {one for entry in entries for one in (entry[0], entry[2])}
    assume(not {name, f"{name}x", token, other, short} & taken and token != other)
    assume(short not in f"{name}x" and not token.startswith(short))
    for how, malformed in malformations(name, role, token, short, other):
        valid = [written([entry]) for entry in entries]
        value = ",".join([*valid[:where], malformed, *valid[where:]])

        # When it is parsed
        with pytest.raises(ValueError, match=r"^entry \d+") as refused:
            parse_tokens(value)

        # Then the message names the entry by its position, and holds no token, nor the short one
        message = str(refused.value)
        for secret in [token, other, short, *(entry[2] for entry in entries)]:
            assert secret not in message, how


def test_a_token_one_character_short_of_the_minimum_is_refused_naming_the_minimum() -> None:
    # When an entry's token is 31 characters
    with pytest.raises(ValueError, match="entry 1 \\(ann\\): the token must be at least 32 characters"):
        parse_tokens("ann:operator:" + "t" * (MIN_TOKEN_LENGTH - 1))

    # Then it is refused, and 32 are accepted
    assert [one.name for one in parse_tokens("ann:operator:" + "t" * MIN_TOKEN_LENGTH).values()] == ["ann"]


@PROPERTY
@given(entries=configurations(), data=st.data())
def test_match_finds_the_operator_of_a_token_and_none_for_anything_near_it(
    entries: list[tuple[str, str, str]], data: st.DataObject
) -> None:
    # Given the operators of a valid list
    operators = parse_tokens(written(entries))
    name, role, token = data.draw(st.sampled_from(entries))

    # When their tokens, and strings near them, are presented
    found = match(operators, token)
    near = data.draw(
        st.one_of(
            st.just(token[:-1]),
            st.just(token + "x"),
            st.just(" " + token),
            st.just(token.upper() if token.upper() != token else token.lower() + "A"),
            st.integers(0, len(token) - 1).map(
                lambda at: token[:at] + chr((ord(token[at]) % 0x7E) + 1) + token[at + 1 :]
            ),
            st.text(max_size=80),
        )
    )

    # Then the token finds its own operator, and a near miss none (unless it is another configured token)
    assert found == Operator(name, role, fingerprint(token))  # type: ignore[arg-type]
    assert match(operators, near) == operators.get(near)
    assert match(operators, "") is None


# ---------------------------------------------------------------- payloads and record content


def visible(text: str, *allowed: str) -> bool:
    """Whether every character of `text` is one a reader sees (or one of `allowed`)."""
    return all(char.isprintable() or char in allowed for char in text)


json_documents = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
payloads = st.one_of(
    st.binary(max_size=2048),
    st.text(max_size=2048).map(str.encode),
    st.text(st.characters(codec="utf-8", exclude_categories=["Cc", "Cs"]), max_size=512).map(str.encode),
    json_documents.map(lambda document: json.dumps(document, ensure_ascii=False).encode()),
    st.sampled_from([b"", b"\x00", b"<script>alert(1)</script>", b"\xff\xfe", b'{"a": "\\u202e\\u0000"}', b"[]"]),
)


@PROPERTY
@given(payload=payloads)
def test_a_payload_is_shown_as_text_json_or_hex_never_raising_and_never_losing_content_below_the_limits(
    payload: bytes,
) -> None:
    # When any payload is shown
    shown = payload_view(payload)

    # Then it is hex exactly when it is not UTF-8 text or holds characters text would hide; otherwise text, or
    # JSON that reads back to the same document; and what is shown holds no character a reader cannot see
    try:
        text: str | None = payload.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    hidden = text is None or not visible(text, "\n", "\t")
    assert (shown.kind == "hex") is hidden
    assert shown.size == len(payload)
    if shown.kind == "hex":
        assert bytes.fromhex("".join(line[10:57] for line in shown.body.splitlines())) == payload[:HEX_LIMIT]
        assert (shown.shown, shown.cut) == (min(len(payload), HEX_LIMIT), len(payload) > HEX_LIMIT)
        assert visible(shown.body, "\n")
    elif shown.kind == "json":
        assert json.loads(shown.body) == json.loads(payload)
        assert not shown.cut
        assert visible(shown.body, "\n")
    else:
        assert shown.kind == "text"
        assert (shown.body, shown.shown, shown.cut) == (text, len(text or ""), False)
        assert visible(shown.body, "\n", "\t")


@pytest.mark.parametrize(
    ("payload", "kind"),
    [
        (b"<" * (TEXT_LIMIT + 7), "text"),
        (("é" * (TEXT_LIMIT + 1)).encode(), "text"),
        (json.dumps(["x" * 10] * (TEXT_LIMIT // 10)).encode(), "json"),
        (b"\x00" * (HEX_LIMIT + 1), "hex"),
    ],
    ids=["ascii-text", "two-byte-text", "json", "binary"],
)
def test_a_payload_past_the_limit_is_cut_and_says_so(payload: bytes, kind: str) -> None:
    # When a payload longer than what is shown is revealed
    shown = payload_view(payload)

    # Then the first part is shown, and the view says it was cut
    assert (shown.kind, shown.cut, shown.size) == (kind, True, len(payload))
    assert shown.shown == (HEX_LIMIT if kind == "hex" else TEXT_LIMIT)


def test_a_payload_within_the_limit_is_not_cut_even_when_it_has_more_bytes_than_characters() -> None:
    # When a text of two-byte characters, as many as the limit, is revealed
    shown = payload_view(("é" * TEXT_LIMIT).encode())

    # Then all of it is shown, and nothing is said to be cut
    assert (shown.kind, shown.shown, shown.cut) == ("text", TEXT_LIMIT, False)
    assert payload_view(None).kind == "none"


@PROPERTY
@given(value=st.one_of(st.text(), st.integers(), st.text(st.characters(categories=["Cc", "Cf", "Zl", "Zp", "Co"]))))
def test_record_content_is_printed_as_one_visible_line(value: Any) -> None:
    # When any key, header or id is made printable
    shown = printable(value)

    # Then every character is visible (no control, format or separator character: nothing hides or breaks a
    # line), and text that was visible already is left as it is
    assert visible(shown)
    assert "\n" not in shown
    text = value if isinstance(value, str) else str(value)
    if visible(text):
        assert shown == text


# ---------------------------------------------------------------- the trace link

TRACE_URL = "http://jaeger.internal:16686/trace/{trace_id}?from=console"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
hex_ids = st.text("0123456789abcdef", min_size=32, max_size=32)
# Near misses of a trace id (a character too many or too few, upper case, a quote, a bidi override), and any text
near_ids = st.sampled_from(
    [TRACE_ID + "0", TRACE_ID[1:], TRACE_ID.upper(), TRACE_ID[:-1] + '"', "\u202e" + TRACE_ID[1:], f"{TRACE_ID}\n"]
)


def test_a_trace_id_is_linked_through_the_trace_url_with_nothing_else_changed() -> None:
    assert trace({"traceId": TRACE_ID}, TRACE_URL) == Trace(
        TRACE_ID, f"http://jaeger.internal:16686/trace/{TRACE_ID}?from=console"
    )
    assert trace({"traceId": TRACE_ID}, "") == Trace(TRACE_ID, None)
    assert trace({"traceId": None}, TRACE_URL) == Trace(None, None)
    assert trace({}, TRACE_URL) == Trace(None, None)


@PROPERTY
@given(value=st.one_of(hex_ids, near_ids, st.text(max_size=40), st.integers(), st.none(), st.lists(hex_ids)))
def test_only_32_lowercase_hex_digits_are_ever_put_in_a_trace_link(value: Any) -> None:
    # When any value an envelope could hold as its traceId is shown
    shown = trace({"traceId": value}, TRACE_URL)

    # Then text is kept as the id, anything else is none; and a link is there exactly for a W3C trace id
    assert shown.trace_id == (value if isinstance(value, str) else None)
    if isinstance(value, str) and len(value) == 32 and set(value) <= set("0123456789abcdef"):
        assert shown.url == TRACE_URL.replace("{trace_id}", value)
    else:
        assert shown.url is None


# ---------------------------------------------------------------- the chart


NOW = 1_780_000_000.0  # any moment; the chart's window ends at its hour
hours = st.integers(min_value=-30, max_value=5).map(lambda back: int(NOW // 3600) * 3600 + back * 3600)
chart_rows = st.lists(
    st.fixed_dictionaries(
        {
            "error_code": st.sampled_from(["MALFORMED_PAYLOAD", "INVALID_FIELD", "SCHEMA_UNSUPPORTED", "X" * 40]),
            "hour": hours,
            "quarantined": st.integers(min_value=0, max_value=10**9),
        }
    ),
    max_size=80,
)


@PROPERTY
@given(rows=chart_rows)
def test_the_chart_bars_stay_inside_the_box_and_count_the_last_day(rows: list[dict[str, Any]]) -> None:
    # When any hourly counts are charted
    drawn = chart(NOW, rows)

    # Then every bar lies within the SVG box, the columns stack up to at most its height, and the total is
    # what the last 24 hours counted
    assert (drawn.width, drawn.height) == (CHART_WIDTH, CHART_HEIGHT)
    for bar in drawn.bars:
        assert bar.x >= 0
        assert bar.x + BAR_WIDTH <= CHART_WIDTH
        assert bar.y >= -ROUNDING
        assert bar.height >= 0
        assert bar.y + bar.height <= CHART_HEIGHT + ROUNDING
    first = int(NOW // 3600) * 3600 - 23 * 3600
    in_window = [row for row in rows if first <= row["hour"] <= NOW]
    assert drawn.total == sum(row["quarantined"] for row in in_window)
    assert len({bar.x for bar in drawn.bars}) <= 24


# ---------------------------------------------------------------- the login limit


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@PROPERTY
@given(
    steps=st.lists(
        st.tuples(st.one_of(st.integers(0, 3), st.integers(0, 70)), st.booleans(), st.booleans()), max_size=60
    )
)
@example(steps=[(1, True, False)] * 6 + [(0, False, True)])  # six racing failures: blocked until the second leaves
def test_the_login_limit_blocks_a_client_with_five_failures_in_the_last_minute_until_one_leaves_it(
    steps: list[tuple[int, bool, bool]],
) -> None:
    # Given a limiter and a clock; and a client that, at each step, waits some seconds, (maybe) fails a login
    # (the limiter counts a failure even when it blocks: two requests may have raced past the check), and
    # (maybe) waits as long as it was told to; while another client fails none
    clock = Clock()
    limiter = LoginLimiter(attempts=5, window=60.0, clock=clock)
    failures: list[float] = []
    for wait, fails, waits_out in steps:
        clock.now += wait
        if fails:
            limiter.failed("10.0.0.1")
            failures.append(clock.now)

        # Then it is blocked exactly while five of its failures are less than a minute old, for as long as it
        # takes the fifth newest of them to leave the minute (and not longer); the other client never is
        recent = [at for at in failures if at > clock.now - 60]
        blocked = limiter.blocked("10.0.0.1")
        if len(recent) >= 5:
            assert blocked == recent[-5] + 60 - clock.now
            if waits_out:
                clock.now += blocked
                assert limiter.blocked("10.0.0.1") is None
        else:
            assert blocked is None
        assert limiter.blocked("10.0.0.2") is None


def test_five_failures_block_for_the_rest_of_the_minute_and_then_the_client_may_try_again() -> None:
    # Given five failures one second apart
    clock = Clock()
    limiter = LoginLimiter(clock=clock)
    for _ in range(5):
        limiter.failed("a")
        clock.now += 1

    # Then the client waits until the first is a minute old, and not a moment longer
    assert limiter.blocked("a") == 55.0
    clock.now += 54.5
    assert limiter.blocked("a") == 0.5
    clock.now += 0.5
    assert limiter.blocked("a") is None


# ---------------------------------------------------------------- when the console refuses to start


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No `ORDERS_*` variable of the machine running the tests leaks into the settings."""
    for variable in list(os.environ):
        if variable.upper().startswith("ORDERS_"):
            monkeypatch.delenv(variable)


def console(bind: str, *, tokens: str = "ann:operator:" + "t" * 40, behind_tls: bool = False) -> OrderSettings:
    """Settings of a console with these tokens and bind address."""
    return OrderSettings(console_bind=bind, console_tokens=tokens, console_behind_tls=behind_tls)


def test_without_a_token_the_console_refuses_to_start_naming_the_variable() -> None:
    # When no token is configured
    message = refusal(console("127.0.0.1:8088", tokens=""))

    # Then the refusal names the variable and what an entry looks like
    assert message is not None
    assert "ORDERS_CONSOLE_TOKENS is not set" in message
    assert "name:role:token" in message


@pytest.mark.parametrize(
    "bind", ["0.0.0.0:8088", "[::]:8088", "10.1.2.3:8088", "console.example:8088", "[2001:db8::1]:80"]
)
def test_beyond_loopback_the_console_refuses_to_start_unless_tls_is_acknowledged(bind: str) -> None:
    # When the console would listen beyond loopback, without and with TLS acknowledged in front
    without = refusal(console(bind))
    behind = refusal(console(bind, behind_tls=True))

    # Then it refuses without, naming the variable to set, and starts with
    assert without is not None
    assert "ORDERS_CONSOLE_BEHIND_TLS=true" in without
    assert bind in without
    assert behind is None


@pytest.mark.parametrize("bind", ["127.0.0.1:8088", "127.9.9.9:1", "[::1]:8088", "localhost:8088"])
def test_on_loopback_the_console_starts_without_tls(bind: str) -> None:
    # When the console listens on a loopback address, Then nothing refuses it
    assert refusal(console(bind)) is None


@PROPERTY
@given(address=st.ip_addresses(), behind_tls=st.booleans())
def test_any_address_is_refused_exactly_when_it_is_not_loopback_and_tls_is_not_acknowledged(
    address: Any, behind_tls: bool
) -> None:
    # Given any IPv4 or IPv6 address to listen on
    host = f"[{address}]" if address.version == 6 else str(address)

    # When the console would listen there
    message = refusal(console(f"{host}:8088", behind_tls=behind_tls))

    # Then it refuses exactly when the address is not loopback and TLS is not acknowledged
    assert (message is not None) is (not address.is_loopback and not behind_tls)


@given(st.lists(st.text(string.printable, min_size=1, max_size=40), max_size=50), st.text(min_size=1, max_size=20))
@PROPERTY
def test_a_dry_runs_list_reads_back_from_its_confirm_form_as_it_was_listed(ids: list[str], consumer: str) -> None:
    # Given what a dry run lists, carried in its confirm form
    listed = {"consumer": consumer, "failure_ids": ids, "missing": []}
    carried = confirm_field(listed, len(ids))

    # When the confirmation reads it back, Then it is exactly the list (whatever the ids hold)
    assert dry_run_list({"picked": [carried]}) == listed


def test_a_dry_run_listing_more_than_a_form_field_holds_is_refused_rather_than_cut() -> None:
    # Given a selection whose list is larger, percent-encoded, than a confirm form may carry
    ids = [f"orders/{n % 12}/{884_193 + n}" for n in range(40_000)]

    # When a dry run would carry it, Then it is refused (400) with the count, and no form holds part of it
    with pytest.raises(Refused) as refused:
        confirm_field({"consumer": "order-service", "failure_ids": ids}, len(ids))
    assert refused.value.status == 400
    assert "40000 records" in refused.value.reason


@pytest.mark.parametrize(
    "garbled",
    ["not json", "[]", '{"failure_ids": "orders/0/1"}', '{"failure_ids": [1]}', '{"consumer": 5, "failure_ids": []}'],
)
def test_a_garbled_dry_run_list_is_refused(garbled: str) -> None:
    # When a confirmation carries a list that is not one a dry run writes, Then it is refused, not guessed at
    with pytest.raises(Refused) as refused:
        dry_run_list({"picked": [garbled]})
    assert refused.value.status == 400
