"""Hostile record content in a real browser (issue 16): keys, header names and values, message ids and payloads
that hold markup, event handlers, `javascript:` URLs, NUL, invalid UTF-8, and a 1 MB payload, quarantined by the
service's own processor and shown on the list, record, held-key and error pages, and revealed by an operator.

Nothing from a record may run or load: no dialog opens, no script or image of the content reaches the DOM, the
browser reports no error and no Content-Security-Policy violation, the strings are shown as text, and a huge
payload neither breaks the page nor widens it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from playwright.async_api import ConsoleMessage, Dialog, Error, Page, expect
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.policy.records import SourceRecord
from tests.browser.support import SOURCE, LogIn, ServeConsole, quarantine_at
from tests.support import rows

SCRIPT = "<script>alert(1)</script>"
IMAGE = '"><img src=x onerror=alert(1)>'
JS_URL = "javascript:alert(1)"
MEGABYTE = 1024 * 1024
# A megabyte of one line of markup-looking text: no newline for the browser to wrap at, nothing it may run.
HUGE = ((SCRIPT + IMAGE + JS_URL + " ") * (MEGABYTE // 64 + 1)).encode()[:MEGABYTE]
VIEWPORT_SLACK = 1.1  # how much wider than the viewport a page may lay out (a scrollbar, a rounding)
# Records the test reads back: (offset, what its key holds as text, what its payload shows).
SCRIPTED, IMAGED, LINKED, NUL, BINARY, BIG = range(6)

# Collects what the page does that it must not: runs as a script in every document before the page's own
# scripts, so a violation by the very first element is seen. (Playwright injects it outside the page's CSP.)
WATCH_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__violations.push(`${event.violatedDirective} ${event.blockedURI} ${event.sample}`);
});
"""
# What in the DOM could come from record content: scripts other than the console's two, any image, any element
# with an event-handler attribute, any link or form target that is not of this site.
FOREIGN_ELEMENTS = """
() => {
  const own = ["/static/htmx.min.js", "/static/console.js"];
  const found = [];
  for (const script of document.querySelectorAll("script")) {
    const path = script.src ? new URL(script.src).pathname : "(inline)";
    if (!own.includes(path)) found.push(`script ${path} ${script.textContent.slice(0, 40)}`);
  }
  for (const image of document.querySelectorAll("img, iframe, object, embed, svg image")) {
    found.push(`${image.tagName} ${image.outerHTML.slice(0, 60)}`);
  }
  for (const element of document.querySelectorAll("*")) {
    for (const attribute of element.attributes) {
      if (attribute.name.startsWith("on")) found.push(`${element.tagName} ${attribute.name}`);
    }
  }
  for (const link of document.querySelectorAll("a[href], form[action]")) {
    const target = new URL(link.href || link.action, location.href);
    if (target.origin !== location.origin) found.push(`${link.tagName} to ${target.href}`);
  }
  return found;
}
"""


@dataclass
class Watched:
    """What a page reported while it was watched: dialogs, console errors, uncaught errors."""

    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def watch(page: Page) -> Watched:
    """Record every dialog (and dismiss it), console error and uncaught error of `page`, and CSP violations."""
    seen = Watched()

    async def on_dialog(dialog: Dialog) -> None:  # Playwright runs an async handler as a task of its own
        seen.dialogs.append(f"{dialog.type}: {dialog.message}")
        await dialog.dismiss()

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            seen.errors.append(f"console: {message.text}")

    def on_page_error(error: Error) -> None:
        seen.errors.append(f"page: {error}")

    page.on("dialog", on_dialog)
    page.on("console", on_console)
    page.on("pageerror", on_page_error)
    await page.add_init_script(WATCH_VIOLATIONS)
    return seen


async def assert_harmless(page: Page, seen: Watched, what: str, *, status: int = 200) -> None:
    """The page ran and loaded nothing of the content, reported nothing (but the browser's own line about an
    error status, for an error page), and is no wider than the viewport."""
    await page.wait_for_load_state("load")
    if status >= 400:
        about_status = f"console: Failed to load resource: the server responded with a status of {status}"
        assert [error for error in seen.errors if error.startswith(about_status)] == seen.errors[:1], what
        del seen.errors[:1]
    violations = await page.evaluate("() => window.__violations")
    foreign = await page.evaluate(FOREIGN_ELEMENTS)
    width = await page.evaluate("() => document.scrollingElement.scrollWidth")
    viewport = await page.evaluate("() => window.innerWidth")
    assert seen.dialogs == [], what
    assert seen.errors == [], what
    assert violations == [], what
    assert foreign == [], what
    assert width <= viewport * VIEWPORT_SLACK, f"{what}: laid out {width}px wide in a {viewport}px viewport"


def hostile_records(at: datetime) -> list[SourceRecord]:
    """One record per kind of hostile content, in the order of `SCRIPTED` … `BIG` (offsets 0 to 5)."""
    stamp = int(at.timestamp() * 1000)

    def record(offset: int, key: bytes, value: bytes, headers: tuple[tuple[str, bytes], ...]) -> SourceRecord:
        return SourceRecord(SOURCE, 0, offset, stamp, key, value, headers)

    return [
        record(
            SCRIPTED,
            SCRIPT.encode(),
            SCRIPT.encode(),
            (("message-id", SCRIPT.encode()), (SCRIPT, IMAGE.encode()), ("link", JS_URL.encode())),
        ),
        record(
            IMAGED,
            IMAGE.encode(),
            json.dumps({"schema": IMAGE, "href": JS_URL, "note": f"</pre>{SCRIPT}"}).encode(),
            (("message-id", IMAGE.encode()), (IMAGE, SCRIPT.encode())),
        ),
        record(LINKED, JS_URL.encode(), JS_URL.encode(), ((JS_URL, JS_URL.encode()), ("referer", JS_URL.encode()))),
        record(
            NUL,
            b"key\x00" + SCRIPT.encode(),
            b"\x00" + SCRIPT.encode() + b"\x00\x1b[31m",
            (("x-\x00" + SCRIPT, b"\x00" + IMAGE.encode()), ("bell", b"\x07" + SCRIPT.encode())),
        ),
        record(
            BINARY,
            b"\xff\xfe" + SCRIPT.encode(),
            b"\xc3\x28" + IMAGE.encode() + b"\xff",
            (("bad-utf8", b"\xff" + SCRIPT.encode()), (IMAGE, b"\xc3\x28")),
        ),
        record(BIG, b"big-one", HUGE, (("message-id", b"big-one.1"),)),
    ]


def failure_id(offset: int) -> str:
    """The failure id the processor gives the record at `offset` of partition 0."""
    return f"{SOURCE}/0/{offset}"


@pytest.fixture
async def hostile(console_settings: Settings, engine: AsyncEngine) -> Settings:
    """The hostile records quarantined by the processor, an hour ago; the key of the first held behind it."""
    at = datetime.now(UTC) - timedelta(hours=1)
    await quarantine_at(console_settings, hostile_records(at), at)
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO key_blocks (consumer_name, ordering_key, failure_id, reason)"
                " VALUES (:consumer, :key, :head, 'quarantined head')"
            ),
            {"consumer": console_settings.consumer_name, "key": SCRIPT, "head": failure_id(SCRIPTED)},
        )
    return console_settings


def pages(consumer: str) -> Iterator[tuple[str, str]]:
    """(name, path) of every page that shows record content, and of pages that echo what a link put in."""
    yield "the queue", "/quarantine"
    yield "the queue sorted by owner", "/quarantine?" + urlencode({"sort": "owner", "direction": "desc"})
    yield "the queue filtered by a hostile key", "/quarantine?" + urlencode({"key": SCRIPT})
    yield "the held keys", "/keys"
    yield "a hostile held key", "/keys/detail?" + urlencode({"consumer": consumer, "key": SCRIPT})
    yield "an error echoing a hostile filter", "/quarantine?" + urlencode({"status": IMAGE + SCRIPT})
    yield "the audit", "/audit"
    for offset in range(BIG + 1):
        yield f"record {offset}", f"/quarantine/{quote(failure_id(offset))}"


async def test_hostile_content_is_shown_as_text_and_nothing_of_it_runs_or_loads(
    hostile: Settings,
    engine: AsyncEngine,
    serve_console: ServeConsole,
    page: Page,
    log_in: LogIn,
    operator_token: str,
) -> None:
    # Given the hostile records quarantined, a console, and ann, an operator, logging in from a link whose
    # `next` is hostile too
    url = await serve_console(hostile)
    seen = await watch(page)
    await page.goto(f"{url}/login?" + urlencode({"next": f'/"><script>alert(1)</script>{JS_URL}'}))
    await assert_harmless(page, seen, "the login page")
    await log_in(page, url, operator_token)

    # When she opens every page that shows record content
    for name, path in pages(hostile.consumer_name):
        response = await page.goto(url + path)
        assert response is not None

        # Then each loads, and nothing of the content runs, loads, or widens the page
        status = 400 if name.startswith("an error") else 200
        assert response.status == status, name
        await assert_harmless(page, seen, name, status=status)

    # And the hostile strings are there, as text, where the records put them
    await page.goto(f"{url}/quarantine")
    queue = await page.locator("#queue").inner_text()
    for hostile_text in (SCRIPT, IMAGE, JS_URL):
        assert hostile_text in queue
    await page.goto(f"{url}/quarantine/{quote(failure_id(SCRIPTED))}")
    await expect(page.locator("dl.facts dd.id:not(#trace)")).to_have_text([SCRIPT, SCRIPT])  # its message id and key
    await expect(page.locator("table.headers")).to_contain_text(SCRIPT)
    await expect(page.locator("table.headers")).to_contain_text(IMAGE)
    await expect(page.locator("table.headers")).to_contain_text(JS_URL)


@pytest.mark.parametrize(
    ("offset", "shown_as", "shown"),
    [
        (SCRIPTED, "text", SCRIPT),
        (IMAGED, "json", IMAGE.replace('"', '\\"')),
        (LINKED, "text", JS_URL),
        (NUL, "hex", "00 3c 73 63 72 69 70 74 3e"),  # NUL, then `<script>` as hex
        (BINARY, "hex", "c3 28 22 3e 3c 69 6d 67"),
        (BIG, "text", HUGE[:2000].decode()),
    ],
    ids=["script", "image-in-json", "javascript-url", "nul", "invalid-utf8", "one-megabyte"],
)
async def test_a_revealed_hostile_payload_is_shown_as_escaped_text_or_hex_and_nothing_of_it_runs(
    hostile: Settings,
    engine: AsyncEngine,
    serve_console: ServeConsole,
    page: Page,
    log_in: LogIn,
    operator_token: str,
    offset: int,
    shown_as: str,
    shown: str,
) -> None:
    # Given the hostile records quarantined, and ann, an operator, logged in on one record's page
    url = await serve_console(hostile)
    seen = await watch(page)
    await log_in(page, url, operator_token)
    await page.goto(f"{url}/quarantine/{quote(failure_id(offset))}")

    # When she reveals its payload
    await page.locator("#reveal").click()

    # Then it is shown as text, JSON or hex, the hostile part visible as it is, nothing of it run or loaded, the
    # page no wider than the viewport; and the reveal is audited
    body = page.locator("#payload-body")
    await expect(body).to_have_class(f"payload payload-{shown_as}")
    assert shown in await body.inner_text()
    await assert_harmless(page, seen, f"the revealed payload of record {offset}")
    audit = await rows(engine, "SELECT actor, action, selection FROM audit_log")
    assert [(row["actor"], row["action"], row["selection"]["failure_id"]) for row in audit] == [
        ("ann", "quarantine.reveal", failure_id(offset))
    ]


async def test_a_one_megabyte_payload_page_loads_shows_its_size_and_keeps_its_width(
    hostile: Settings,
    serve_console: ServeConsole,
    page: Page,
    log_in: LogIn,
    operator_token: str,
) -> None:
    # Given the 1 MB record, and ann, an operator, logged in
    url = await serve_console(hostile)
    seen = await watch(page)
    await log_in(page, url, operator_token)

    # When she opens it and reveals its payload
    await page.goto(f"{url}/quarantine/{quote(failure_id(BIG))}")
    await expect(page.locator("#payload h2 small")).to_have_text(f"{MEGABYTE} bytes")
    await page.locator("#reveal").click()

    # Then the page says how much is shown, the payload box scrolls within the page, and the page is no wider
    body = page.locator("#payload-body")
    await expect(body).to_be_visible()
    shown: dict[str, Any] = await body.evaluate(
        "(box) => ({width: box.getBoundingClientRect().width, height: box.getBoundingClientRect().height,"
        " characters: box.textContent.length})"
    )
    viewport = await page.evaluate("() => window.innerWidth")
    assert shown["width"] <= viewport
    assert shown["height"] <= 600  # the stylesheet caps a payload box; the rest scrolls inside it
    assert 0 < shown["characters"] < MEGABYTE
    await expect(page.locator("#payload p.hint")).to_contain_text(f"the first {shown['characters']}")
    await assert_harmless(page, seen, "the revealed 1 MB payload")


async def test_a_right_to_left_override_is_shown_escaped_in_the_envelope_the_facts_and_the_headers(
    console_settings: Settings,
    serve_console: ServeConsole,
    page: Page,
    log_in: LogIn,
    operator_token: str,
) -> None:
    # Given a record whose key and message id hold a right-to-left override (U+202E), which would show the text
    # after it reversed, and an escape sequence
    key = "A-1\u202eevil\x1b[2J"
    at = datetime.now(UTC) - timedelta(hours=1)
    stamp = int(at.timestamp() * 1000)
    hostile = SourceRecord(SOURCE, 0, 0, stamp, key.encode(), b"nope", (("message-id", key.encode()),))
    await quarantine_at(console_settings, [hostile], at)
    url = await serve_console(console_settings)
    await log_in(page, url, operator_token)

    # When an operator opens its page
    await page.goto(f"{url}/quarantine/{quote(failure_id(0))}")

    # Then the envelope's <pre>, the facts and the headers show the override and the escape as escapes, and the
    # page holds neither anywhere
    escaped = "A-1\\u202eevil\\x1b[2J"
    assert escaped.replace("\\x1b", "\\u001b") in await page.locator("pre.document").inner_text()
    await expect(page.locator("dl.facts dd.id:not(#trace)")).to_have_text([escaped, escaped])  # its message id and key
    await expect(page.locator("table.headers")).to_contain_text(escaped)
    text_of_page = await page.locator("html").inner_text()
    assert "\u202e" not in text_of_page
    assert "\x1b" not in text_of_page
