"""Each downstream's credentials (contract §6) reach it: its bearer token, read from `ORDERS_<DOWNSTREAM>_TOKEN_FILE`,
its CA and its client certificate. Real PostgreSQL and Kafka, the service's own clients through its composition root,
and the three APIs behind an HTTPS server that requires a client certificate signed by the tests' CA
(scripts/test-certs) and answers only its bearer token.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.policy.breaker import State
from tests.support import ROOT, Topics, eventually, produce, read_topic, rows, running, scalar, settings_for
from tests.support.orders import placed, shipped

pytestmark = pytest.mark.slow

DOWNSTREAMS = ("customers", "payments", "emails")


@pytest.fixture(scope="module")
def tls() -> Path:
    """The tests' CA and the certificates it signs (made once, then cached by scripts/test-certs)."""
    made = subprocess.run([ROOT / "scripts" / "test-certs"], capture_output=True, text=True, check=True)
    return Path(made.stdout.splitlines()[-1])


@dataclass(frozen=True)
class Call:
    """One request as the server saw it: which API, the Authorization header, the client certificate's CN."""

    api: str
    authorization: str | None
    client: str


class Apis:
    """The customer, payment and email APIs over mutual TLS: each answers only its own bearer token (else a login
    page, 401), and notes every call with the verified client certificate it came with."""

    def __init__(self, tls: Path) -> None:
        self.tokens = {name: secrets.token_urlsafe(24) for name in DOWNSTREAMS}
        self.calls: list[Call] = []
        self.payments: list[dict[str, Any]] = []
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=tls / "ca.pem")
        self.context.load_cert_chain(tls / "kafka-broker.pem", tls / "kafka-broker.key")  # for 127.0.0.1
        self.context.verify_mode = ssl.CERT_REQUIRED
        self.app = web.Application()
        self.app.router.add_get("/customers/{id}", self._customer)
        self.app.router.add_post("/payments", self._payment)
        self.app.router.add_post("/emails", self._email)

    def _signed_in(self, request: web.Request, api: str) -> bool:
        certificate = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(item for part in (certificate or {}).get("subject", ()) for item in part)
        authorization = request.headers.get("Authorization")
        self.calls.append(Call(api, authorization, subject.get("commonName", "")))
        return authorization == f"Bearer {self.tokens[api]}"

    async def _customer(self, request: web.Request) -> web.Response:
        if not self._signed_in(request, "customers"):
            return web.Response(status=401, text="<html>Sign in</html>", content_type="text/html")
        return web.json_response({"id": request.match_info["id"], "status": "active"})

    async def _payment(self, request: web.Request) -> web.Response:
        if not self._signed_in(request, "payments"):
            return web.Response(status=401, text="<html>Sign in</html>", content_type="text/html")
        self.payments.append({"key": request.headers.get("Idempotency-Key"), **await request.json()})
        return web.json_response({"payment_id": f"pay_{len(self.payments)}", "status": "succeeded"}, status=201)

    async def _email(self, request: web.Request) -> web.Response:
        if not self._signed_in(request, "emails"):
            return web.Response(status=401, text="<html>Sign in</html>", content_type="text/html")
        return web.json_response({"email_id": f"em_{(await request.json())['ref']}"}, status=202)


@pytest.fixture
async def apis(tls: Path) -> AsyncIterator[tuple[Apis, str]]:
    """The APIs served over mutual TLS on a free port, and their base URL."""
    served = Apis(tls)
    runner = web.AppRunner(served.app, access_log=None)
    await runner.setup()
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, listening, ssl_context=served.context)
    await site.start()
    try:
        yield served, f"https://127.0.0.1:{listening.getsockname()[1]}"
    finally:
        await runner.cleanup()


def configured(
    database_url: str,
    kafka: str,
    topics: Topics,
    url: str,
    tokens: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    ca: Path,
    cert: Path,
    downstreams: tuple[str, ...] = DOWNSTREAMS,
    **overrides: str,
) -> Settings:
    """Settings that call these downstreams at `url` with these files, each token from its `…_TOKEN_FILE`."""
    files: dict[str, Any] = {}
    for name in downstreams:
        token = tmp_path / f"{name}.token"
        token.write_text(f"{tokens[name]}\n")  # as a mounted secret may end
        monkeypatch.setenv(f"ORDERS_{name.upper()}_TOKEN_FILE", str(token))
        files |= {
            f"{name}_url": url,
            f"{name}_ca_file": str(ca),
            f"{name}_cert_file": str(cert),
            f"{name}_key_file": str(cert.with_suffix(".key")),
        }
    return settings_for(database_url, kafka, topics, http_timeout="1s", **(files | overrides))


async def test_an_order_flows_with_each_downstreams_token_and_client_certificate(
    engine: AsyncEngine,
    database_url: str,
    kafka: str,
    topics: Topics,
    apis: tuple[Apis, str],
    tls: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given the three APIs behind mutual TLS, and the service given their CA, its client certificate and their tokens
    server, url = apis
    settings = configured(
        database_url,
        kafka,
        topics,
        url,
        server.tokens,
        tmp_path,
        monkeypatch,
        ca=tls / "ca.pem",
        cert=tls / "client-service.pem",
    )
    await produce(kafka, topics.source, [("T-1", placed("T-1"), {}), ("T-1", shipped("T-1"), {})], partition=0)

    # When the consumer and the effect worker run
    async with running(settings, "consumer_loop", "effect_worker"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 2 FROM effects WHERE state = 'sent'"), timeout=30)

    # Then the order was placed and shipped, its payment captured and its email sent
    assert await scalar(engine, "SELECT count(*) FROM inbox WHERE status = 'processed'") == 2
    assert [(payment["key"], payment["amount_cents"]) for payment in server.payments] == [("T-1/payment.capture", 2500)]
    # And every call carried its own downstream's token and the service's verified client certificate
    assert {call.api for call in server.calls} == set(DOWNSTREAMS)
    assert {(call.api, call.authorization, call.client) for call in server.calls} == {
        (name, f"Bearer {server.tokens[name]}", "service") for name in DOWNSTREAMS
    }


@pytest.mark.parametrize("wrong", ["token", "ca"], ids=["a wrong token", "a CA that did not sign the server's"])
async def test_a_directory_refusing_our_credentials_decides_nothing_about_an_order_and_it_waits(
    engine: AsyncEngine,
    database_url: str,
    kafka: str,
    topics: Topics,
    apis: tuple[Apis, str],
    tls: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    wrong: str,
) -> None:
    # Given the customer directory behind mutual TLS, and the service with its token, or its CA, wrong
    server, url = apis
    tokens = server.tokens | ({"customers": "not-the-token"} if wrong == "token" else {})
    ca = tls / ("other-ca.pem" if wrong == "ca" else "ca.pem")
    settings = configured(
        database_url,
        kafka,
        topics,
        url,
        tokens,
        tmp_path,
        monkeypatch,
        ca=ca,
        cert=tls / "client-service.pem",
        downstreams=("customers",),
    )
    await produce(kafka, topics.source, [("W-1", placed("W-1"), {})], partition=0)

    # When the consumer runs with it until the directory's breaker has opened, and opened again after a probe
    async with running(settings, "consumer_loop") as container:
        guard = container.breakers()["customers"]
        await eventually(lambda: asyncio.sleep(0, guard.breaker.openings >= 2), timeout=20)
        # Then the breaker is open as misconfigured, and nothing was decided about the order: it waits
        assert (guard.breaker.state, guard.breaker.misconfigured) == (State.OPEN, True)
        assert await scalar(engine, "SELECT count(*) FROM inbox") == 0
        assert await scalar(engine, "SELECT count(*) FROM quarantine") == 0

    assert len(await read_topic(kafka, topics.rejected, expect=0, timeout=1)) == 0
    # (the server saw the wrong token; a certificate the service refused sent it nowhere)
    assert {call.authorization for call in server.calls} == ({"Bearer not-the-token"} if wrong == "token" else set())
    printed = capfd.readouterr()
    assert "Traceback" not in printed.out + printed.err


async def test_a_payment_provider_whose_certificate_our_ca_refuses_fails_no_payment_and_the_capture_waits(
    engine: AsyncEngine,
    database_url: str,
    kafka: str,
    topics: Topics,
    apis: tuple[Apis, str],
    tls: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a directory the service reaches, and at the same host and port (one gateway) a payment provider given a CA
    # that did not sign its certificate
    server, url = apis
    settings = configured(
        database_url,
        kafka,
        topics,
        url,
        server.tokens,
        tmp_path,
        monkeypatch,
        ca=tls / "ca.pem",
        cert=tls / "client-service.pem",
        downstreams=("customers", "payments"),
        payments_ca_file=str(tls / "other-ca.pem"),
    )
    await produce(kafka, topics.source, [("P-1", placed("P-1"), {})], partition=0)

    # When the consumer and the effect worker run until the provider's breaker has opened again after a probe
    async with running(settings, "consumer_loop", "effect_worker") as container:
        guard = container.breakers()["payments"]
        await eventually(lambda: asyncio.sleep(0, guard.breaker.openings >= 2), timeout=20)
        assert guard.breaker.misconfigured

    # Then the order was placed (the directory's own CA went with its calls), and its capture waits pending, no
    # attempt spent, in the provider's misconfiguration
    assert await scalar(engine, "SELECT count(*) FROM inbox WHERE status = 'processed'") == 1
    assert {call.api for call in server.calls} == {"customers"}
    [capture] = await rows(engine, "SELECT state, attempts, last_error_code FROM effects")
    assert capture == {"state": "pending", "attempts": 0, "last_error_code": "PROVIDER_MISCONFIGURED"}
    assert server.payments == []
