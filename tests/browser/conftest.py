"""Fixtures for the console in a real headless Chromium: a console served by uvicorn on a free loopback port of
this test's migrated database (wired exactly as `order-service console` wires it), an operator's and a
viewer's token, the browser and a page, logging in through the form, and screenshots.

Chromium is Debian's (`/usr/bin/chromium`, or `CONSOLE_CHROMIUM`): Playwright's own download is not used.
Each test gets its own browser, console and event loop, so nothing one test does (a session, a login limit, a
run in the background) is seen by another.

Fixtures other browser tests rely on (keep the names):
- `console_url`: the base URL (`http://127.0.0.1:<port>`, no trailing slash) of a running console on this
  test's fresh, migrated database (`database_url`), with `operator_token` (ann, operator) and `viewer_token`
  (vic, viewer) configured;
- `serve_console`: start another console with settings of the test's choosing (`console_settings` is the
  default), e.g. with Kafka and a source topic for a reprocess run; stopped when the test ends;
- `browser`, `page`: a headless Chromium and a fresh page (its own context: no cookie shared) with a
  1280x800 viewport; `new_page` opens another one (a second person, in a context of its own);
- `log_in(page, base_url, token)`: log in through the console's login form and land on the overview;
- `screenshot(page, name)`: save the page as `<name>.png` under `CONSOLE_SCREENSHOTS` when set, else under
  the test's `tmp_path`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from playwright.async_api import Browser, BrowserContext, Page, ViewportSize, async_playwright, expect

from service.cli.common import assembled, provide, serve_domain
from service.cli.console import _reprocess as reprocess_as_the_cli_does
from service.config import Settings, load_settings
from service.console.app import create_app
from service.console.web import Wiring
from service.orders.domain import DOMAIN
from tests.browser.support import LogIn, NewPage, Screenshot, ServeConsole

CHROMIUM = os.environ.get("CONSOLE_CHROMIUM", "/usr/bin/chromium")
VIEWPORT: ViewportSize = {"width": 1280, "height": 800}
STARTUP_DEADLINE = 15.0  # seconds for uvicorn to answer /healthz
SHUTDOWN_DEADLINE = 15.0  # seconds for uvicorn to stop (a request in flight finishes first)
# How long an `expect` waits for the page to come true: a deadline, not a pause (it returns as soon as it holds).
# Playwright's 5 s is too short for a CI machine shared with other suites.
EXPECT_DEADLINE_MS = 20_000

expect.set_options(timeout=EXPECT_DEADLINE_MS)


@pytest.fixture
def operator_token() -> str:
    """The token of `ann`, an operator (40 characters, random per test)."""
    return secrets.token_urlsafe(30)


@pytest.fixture
def viewer_token() -> str:
    """The token of `vic`, a viewer (40 characters, random per test)."""
    return secrets.token_urlsafe(30)


@pytest.fixture
def console_tokens(operator_token: str, viewer_token: str) -> str:
    """`ORDERS_CONSOLE_TOKENS` for ann (operator) and vic (viewer)."""
    return f"ann:operator:{operator_token},vic:viewer:{viewer_token}"


@pytest.fixture
def console_settings(database_url: str, console_tokens: str) -> Settings:
    """The console's settings as the command reads them (the domain's settings class), on this test's database."""
    return load_settings(DOMAIN.settings, database_url=database_url, console_tokens=console_tokens)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: Ctrl-C stops pytest, not only the console."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Leave the process's signal handlers alone."""
        yield


@contextlib.asynccontextmanager
async def _console(settings: Settings) -> AsyncIterator[str]:
    """Serve the console for `settings` on a free loopback port in this event loop, wired as the command wires it
    (the container's engine, effect specs and failing-field finder, and the CLI's reprocess); yield its base URL
    once `/healthz` answers, and stop it (deadline-bound) when the block ends."""
    serve_domain(DOMAIN)  # the command line's parts serve the order domain, as its console script makes them
    async with assembled(settings) as container:
        wiring = Wiring(
            settings=settings,
            engine=await provide(container, "engine"),
            effect_specs=container.effect_specs(),
            failing_field=container.failing_field(),
            reprocess=reprocess_as_the_cli_does,
            codes=DOMAIN.error_codes,
            decode=container.decode(),
        )
        # The socket listens before uvicorn starts, so the port is known and never raced for.
        listening = socket.create_server(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        config = uvicorn.Config(
            create_app(wiring),
            log_config=None,
            access_log=False,
            lifespan="on",
            server_header=False,
            http="h11",
            ws="none",
            timeout_graceful_shutdown=5,
        )
        server = _Server(config)
        serving = asyncio.create_task(server.serve(sockets=[listening]))
        try:
            await _until_healthy(url, serving)
            yield url
        finally:
            server.should_exit = True
            try:
                await asyncio.wait_for(serving, timeout=SHUTDOWN_DEADLINE)
            finally:
                listening.close()


async def _until_healthy(url: str, serving: asyncio.Task[None]) -> None:
    """Wait until the console answers `/healthz` (fail at the deadline, or at once if uvicorn stopped)."""
    deadline = time.monotonic() + STARTUP_DEADLINE
    async with httpx.AsyncClient(timeout=2.0) as client:
        while True:
            if serving.done():
                serving.result()  # raises what stopped it
                raise AssertionError("the console stopped before it answered /healthz")
            with contextlib.suppress(httpx.TransportError):
                if (await client.get(f"{url}/healthz")).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"the console did not answer {url}/healthz within {STARTUP_DEADLINE}s")
            await asyncio.sleep(0.05)


@pytest.fixture
async def serve_console() -> AsyncIterator[ServeConsole]:
    """Start a console for given settings (its base URL); every console started is stopped when the test ends."""
    async with contextlib.AsyncExitStack() as stack:

        async def serve(settings: Settings) -> str:
            """Start a console for `settings`; its base URL once it answers."""
            return await stack.enter_async_context(_console(settings))

        yield serve


@pytest.fixture
async def console_url(serve_console: ServeConsole, console_settings: Settings) -> str:
    """The base URL of a running console on this test's migrated database (ann: operator, vic: viewer)."""
    return await serve_console(console_settings)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """Debian's Chromium, headless (no sandbox: CI runs as root)."""
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            yield chromium
        finally:
            await chromium.close()


@pytest.fixture
async def new_page(browser: Browser) -> AsyncIterator[NewPage]:
    """Open a page in a fresh context of its own (cookies not shared: another person); all closed at the end."""
    contexts: list[BrowserContext] = []

    async def open_page() -> Page:
        """A new page in a new context."""
        context = await browser.new_context(viewport=VIEWPORT)
        contexts.append(context)
        return await context.new_page()

    yield open_page
    for context in contexts:
        await context.close()


@pytest.fixture
async def page(new_page: NewPage) -> Page:
    """A fresh page, 1280x800, in a context of its own."""
    return await new_page()


@pytest.fixture
def log_in() -> LogIn:
    """Log a page in to the console at a base URL through its login form with a token; returns on the overview."""

    async def logging_in(page: Page, base_url: str, token: str) -> None:
        """Fill the login form with `token`, submit it, and wait for the overview."""
        await page.goto(f"{base_url}/login")
        await page.fill("#token", token)
        await page.click("form[action='/login'] button[type=submit]")
        await expect(page).to_have_url(f"{base_url}/")
        await expect(page.locator("h1")).to_have_text("Overview")

    return logging_in


@pytest.fixture
def screenshot_dir(tmp_path: Path) -> Path:
    """Where screenshots go: `CONSOLE_SCREENSHOTS` when set (e.g. docs/console), else the test's tmp_path."""
    chosen = os.environ.get("CONSOLE_SCREENSHOTS")
    directory = Path(chosen) if chosen else tmp_path / "screenshots"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@pytest.fixture
def screenshot(screenshot_dir: Path) -> Screenshot:
    """Save what a page shows (the 1280x800 viewport) as `<name>.png`; returns the file."""

    async def shoot(page: Page, name: str) -> Path:
        """Write `<name>.png` of what `page` shows now."""
        path = screenshot_dir / f"{name}.png"
        await page.screenshot(path=str(path))
        assert path.stat().st_size > 0
        return path

    return shoot
