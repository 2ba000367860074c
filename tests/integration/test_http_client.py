"""The process's HTTP client and the transport under it (service/adapters/transport.py), as black boxes, against a
real TCP server that answers as scripted: keep-alive, every way an answer can be framed, and every way an exchange
can end short, each as the error that says how far it got."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import subprocess
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.adapters import transport
from service.adapters.http import ConnectFailed, Cut, HttpClient, TimedOut, TransportError
from tests.support import eventually

Script = Callable[["Received", asyncio.StreamWriter], Awaitable[None]]
TIMEOUT = 0.5


@dataclass
class Received:
    """One request as the server read it."""

    head: list[str]
    body: bytes

    def header(self, name: str) -> str | None:
        found = [line.split(":", 1)[1].strip() for line in self.head[1:] if line.lower().startswith(f"{name}:")]
        return found[0] if found else None


@dataclass
class Server:
    """Reads requests on each connection and plays `script` for each; counts connections and requests. With
    `read_body` false it answers before reading a request's body (and never reads it)."""

    script: Script
    read_body: bool = True
    connections: int = 0
    ended: int = 0  # connections it has closed, or seen closed
    requests: list[Received] = field(default_factory=list)
    port: int = 0
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                try:
                    raw = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                head = raw.decode().split("\r\n")[:-2]
                length = next(
                    (int(line.split(":")[1]) for line in head if line.lower().startswith("content-length")), 0
                )
                received = Received(head, await reader.readexactly(length) if self.read_body else b"")
                self.requests.append(received)
                await self.script(received, writer)
                if writer.is_closing():
                    return
        finally:
            writer.close()
            self.ended += 1

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def received(self, count: int) -> None:
        async def arrived() -> bool:
            return len(self.requests) >= count

        await eventually(arrived, timeout=5, interval=0.01)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[Server]]]:
    servers: list[tuple[asyncio.Server, Server]] = []

    async def start(script: Script, *, tls: ssl.SSLContext | None = None, read_body: bool = True) -> Server:
        server = Server(script, read_body)
        listening = await asyncio.start_server(server.serve, "127.0.0.1", 0, ssl=tls)
        server.port = listening.sockets[0].getsockname()[1]
        servers.append((listening, server))
        return server

    yield start
    for listening, server in servers:
        for writer in server.writers:
            writer.transport.abort()
        listening.close()


@pytest.fixture
async def client() -> AsyncIterator[HttpClient]:
    opened = HttpClient.open(timedelta(seconds=TIMEOUT), connections=4)
    yield opened
    await opened.close()


def answer(status: int = 200, body: bytes = b"{}", extra: str = "") -> bytes:
    return f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


async def ok(received: Received, writer: asyncio.StreamWriter) -> None:
    writer.write(answer(201, b'{"id": "p-1"}', "Retry-After: 7\r\n"))


async def silent(received: Received, writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(30)


def sends(data: bytes, *, then_close: bool = True) -> Script:
    async def script(received: Received, writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        if then_close:
            await writer.drain()
            writer.close()

    return script


async def test_calls_share_one_kept_alive_connection_and_send_what_was_asked(serve, client: HttpClient) -> None:
    server = await serve(ok)

    first = await client.post(f"{server.url}/payments", json={"a": 1}, headers={"Idempotency-Key": "O-1/p"})
    second = await client.get(f"{server.url}/payments", params={"ref": "a b/&c"})

    assert (first.status_code, first.json(), first.headers["retry-after"]) == (201, {"id": "p-1"}, "7")
    assert second.status_code == 201
    assert server.connections == 1, "the second call opened a connection of its own"
    post, get = server.requests
    assert post.head[0] == "POST /payments HTTP/1.1"
    assert (post.header("host"), post.header("idempotency-key"), post.body) == (
        f"127.0.0.1:{server.port}",
        "O-1/p",
        b'{"a":1}',
    )
    assert post.header("content-type") == "application/json"
    assert get.head[0] == "GET /payments?ref=a%20b%2F%26c HTTP/1.1"
    assert get.header("content-length") is None


@pytest.mark.parametrize(
    ("data", "body"),
    [
        (b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"until": "close"}', b'{"until": "close"}'),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", b"abcde"),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"ok"),
        (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
    ],
    ids=["until-close", "chunked", "interim-100", "no-content"],
)
async def test_every_framing_of_an_answer_is_read_whole(serve, client: HttpClient, data: bytes, body: bytes) -> None:
    server = await serve(sends(data, then_close=b"close" in data))

    got = await client.get(f"{server.url}/x")

    assert got.content == body
    assert got.status_code in (200, 204)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_redirect_is_handed_back_not_followed(serve, client: HttpClient, status: int) -> None:
    server = await serve(sends(answer(status, b"", "Location: /elsewhere\r\n"), then_close=False))

    got = await client.post(f"{server.url}/payments", json={})

    assert (got.status_code, got.headers["location"]) == (status, "/elsewhere")
    assert [request.head[0] for request in server.requests] == ["POST /payments HTTP/1.1"]


async def test_an_answer_ended_by_its_connection_is_not_kept_and_the_next_call_connects_again(
    serve, client: HttpClient
) -> None:
    server = await serve(sends(b"HTTP/1.1 200 OK\r\n\r\nall of it", then_close=True))

    assert (await client.get(f"{server.url}/x")).content == b"all of it"
    assert (await client.get(f"{server.url}/x")).content == b"all of it"

    assert server.connections == 2


async def test_a_connection_the_server_closed_while_idle_is_not_used_again(serve, client: HttpClient) -> None:
    server = await serve(sends(answer(), then_close=True))  # Content-Length, then the server closes

    for count in range(1, 4):
        assert (await client.get(f"{server.url}/x")).status_code == 200

        async def closed(count: int = count) -> bool:  # the server has closed the connection: the client may see it
            return server.ended == count

        await eventually(closed, timeout=5, interval=0.01)

    assert server.connections == 3


async def test_a_silent_server_times_out_after_the_timeout_not_before(serve, client: HttpClient) -> None:
    server = await serve(silent)
    loop = asyncio.get_running_loop()

    started = loop.time()
    with pytest.raises(TimedOut):
        await client.post(f"{server.url}/payments", json={})
    waited = loop.time() - started

    assert TIMEOUT <= waited < 2 * TIMEOUT, waited


@pytest.mark.parametrize(
    "data",
    [
        b"",  # read the request and closed without a byte
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",  # half an answer
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab",  # half a chunk
        b"SMTP ready\r\n\r\n",  # not HTTP
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",  # a length that is not one
    ],
    ids=["nothing", "half", "half-chunk", "garbage", "bad-length"],
)
async def test_an_answer_cut_short_or_unreadable_is_cut(serve, client: HttpClient, data: bytes) -> None:
    server = await serve(sends(data))

    with pytest.raises(Cut):
        await client.post(f"{server.url}/payments", json={})


async def test_an_answer_longer_than_the_limit_is_cut(serve, client: HttpClient, monkeypatch) -> None:
    monkeypatch.setattr(transport, "MAX_ANSWER_BYTES", 1000)
    server = await serve(sends(answer(body=b"x" * 5000), then_close=False))

    with pytest.raises(Cut, match="longer than 1000"):
        await client.get(f"{server.url}/x")


async def test_a_second_answer_to_one_request_closes_the_connection(serve, client: HttpClient) -> None:
    server = await serve(sends(answer() + answer(body=b"[]"), then_close=False))

    assert (await client.get(f"{server.url}/x")).content == b"{}"
    assert (await client.get(f"{server.url}/x")).content == b"{}", "the stray answer was taken for the next one"

    assert server.connections == 2


async def test_a_refused_connection_is_connect_failed_not_timed_out(client: HttpClient) -> None:
    listening = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    listening.close()
    await listening.wait_closed()

    with pytest.raises(ConnectFailed) as failed:
        await client.post(f"http://127.0.0.1:{port}/payments", json={})

    assert failed.value.timed_out is False


async def dribbles(received: Received, writer: asyncio.StreamWriter) -> None:
    """An answer a byte at a time, each within the timeout: the call is slow, never silent (about 4 s in all)."""
    for byte in answer(body=b"{}"):
        writer.write(bytes([byte]))
        await asyncio.sleep(TIMEOUT / 10)


async def test_a_full_pool_waits_the_timeout_and_then_fails_to_connect(serve) -> None:
    server = await serve(dribbles)
    one = HttpClient.open(timedelta(seconds=TIMEOUT), connections=1)
    try:
        held = asyncio.create_task(one.post(f"{server.url}/a", json={}))
        await server.received(1)  # the held call has the only slot

        with pytest.raises(ConnectFailed) as failed:
            await one.post(f"{server.url}/b", json={})

        assert failed.value.timed_out is True
        assert [request.head[0] for request in server.requests] == ["POST /a HTTP/1.1"]
        # A slow answer is not a silent one, but it must be whole within twice the timeout: this one never is
        with pytest.raises(TimedOut, match="no whole answer"):
            await held
    finally:
        await one.close()


@pytest.mark.parametrize(
    ("path", "headers"),
    [("/payments", {"Idempotency-Key": "O\r\nX-Evil: 1"}), ("/pay ments", {}), ("/payments", {"Bad Name": "v"})],
    ids=["line-break-in-value", "space-in-target", "space-in-name"],
)
async def test_a_request_that_cannot_be_written_fails_before_connecting(
    serve, client: HttpClient, path: str, headers: dict[str, str]
) -> None:
    server = await serve(ok)

    with pytest.raises(ConnectFailed) as failed:
        await client.post(f"{server.url}{path}", json={}, headers=headers)

    assert failed.value.timed_out is False
    assert server.connections == 0


async def test_a_call_given_up_on_drops_its_connection_so_its_answer_reaches_no_other_call(serve) -> None:
    server = await serve(silent)
    one = HttpClient.open(timedelta(seconds=5), connections=1)
    try:
        call = asyncio.create_task(one.post(f"{server.url}/a", json={}))
        await server.received(1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        server.script = ok

        assert (await one.post(f"{server.url}/b", json={})).status_code == 201
        assert server.connections == 2
    finally:
        await one.close()


async def test_a_closed_client_refuses_calls(serve) -> None:
    server = await serve(ok)
    closing = HttpClient.open(timedelta(seconds=TIMEOUT), connections=1)
    assert (await closing.get(f"{server.url}/x")).status_code == 201
    await closing.close()

    with pytest.raises(RuntimeError):
        await closing.get(f"{server.url}/x")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300) | st.builds(lambda head, tail: head + tail, st.just(b"HTTP/1.1 "), st.binary()))
def test_whatever_a_server_sends_the_call_ends_as_an_answer_or_a_transport_error(data: bytes) -> None:
    # Given a server that answers a call with any bytes at all and closes
    async def exchange() -> None:
        listening = await asyncio.start_server(Server(sends(data)).serve, "127.0.0.1", 0)
        port = listening.sockets[0].getsockname()[1]
        one = HttpClient.open(timedelta(seconds=TIMEOUT), connections=1)
        try:
            await one.post(f"http://127.0.0.1:{port}/x", json={})
        except TransportError:
            pass  # Then: an error the effect worker reads as an outcome
        finally:
            await one.close()
            listening.close()

    # When the call is made, Then it ends within the timeout, as an answer or a TransportError, nothing else
    asyncio.run(asyncio.wait_for(exchange(), 5 * TIMEOUT))


# ---------------------------------------------------------------- what a hostile or broken downstream may do


async def test_a_head_longer_than_its_limit_is_cut(serve, client: HttpClient) -> None:
    big = "X-Big: " + "a" * 50_000 + "\r\n"
    server = await serve(sends(answer(extra=big * 4), then_close=False))

    with pytest.raises(Cut, match="head is longer"):
        await client.get(f"{server.url}/x")


async def test_endless_interim_answers_time_out(serve, client: HttpClient) -> None:
    async def continues(received: Received, writer: asyncio.StreamWriter) -> None:
        for _ in range(1000):
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await asyncio.sleep(TIMEOUT / 5)

    server = await serve(continues)

    with pytest.raises(TimedOut):
        await asyncio.wait_for(client.post(f"{server.url}/payments", json={}), 5 * TIMEOUT)


async def test_an_answer_ended_by_a_reset_is_cut_not_taken_whole(serve, client: HttpClient) -> None:
    async def resets(received: Received, writer: asyncio.StreamWriter) -> None:
        writer.write(b'HTTP/1.1 200 OK\r\n\r\n{"payment_id": "p-12')  # its end would be the connection's
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        writer.transport.abort()

    server = await serve(resets)

    with pytest.raises(Cut):
        await client.post(f"{server.url}/payments", json={})


async def test_trailers_are_not_taken_for_headers(serve, client: HttpClient) -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nRetry-After: 600\r\n\r\n"
    server = await serve(sends(chunked, then_close=False))

    got = await client.get(f"{server.url}/x")

    assert got.content == b"{}"
    assert "retry-after" not in got.headers


async def test_an_answer_with_a_transfer_coding_other_than_chunks_ends_with_its_connection(
    serve, client: HttpClient
) -> None:
    server = await serve(sends(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\nall", then_close=True))

    assert (await client.get(f"{server.url}/x")).content == b"all"


@pytest.mark.parametrize(
    "data",
    [answer(extra="Connection: close\r\n"), answer().replace(b"HTTP/1.1", b"HTTP/1.0")],
    ids=["connection-close", "http-1.0"],
)
async def test_an_answer_that_ends_keep_alive_is_not_kept(serve, client: HttpClient, data: bytes) -> None:
    server = await serve(sends(data, then_close=False))  # the server leaves it open: the client must not use it

    for _ in range(2):
        assert (await client.get(f"{server.url}/x")).status_code == 200

    assert server.connections == 2


@pytest.mark.xfail(strict=True, reason="aiohttp keeps an idle connection 4 s whatever Keep-Alive says")
async def test_a_keep_alive_timeout_shortens_how_long_a_connection_is_kept(serve, client: HttpClient) -> None:
    # A downstream that closes idle connections at once: half of it is no time at all
    server = await serve(sends(answer(extra="Keep-Alive: timeout=0, max=100\r\n"), then_close=False))

    for _ in range(2):
        await client.get(f"{server.url}/x")

    assert server.connections == 2


async def test_a_query_on_a_url_without_a_path_is_sent(serve, client: HttpClient) -> None:
    server = await serve(ok)

    await client.get(server.url, params={"ref": "r-1"})
    await client.get(f"{server.url}?a=//b", params={"ref": "r-1"})

    assert [request.head[0] for request in server.requests] == [
        "GET /?ref=r-1 HTTP/1.1",
        "GET /?a=//b&ref=r-1 HTTP/1.1",
    ]


@pytest.mark.parametrize(
    "url", ["http://a..b/x", "http://h\udc80/x", "ftp://h/x", "http://user:pw@h/x", "nothing"], ids=repr
)
async def test_a_url_that_cannot_be_reached_is_connect_failed(client: HttpClient, url: str) -> None:
    with pytest.raises(ConnectFailed) as failed:
        await client.get(url, params={"ref": "\udc80"})

    assert failed.value.timed_out is False


async def test_a_connection_whose_request_is_still_being_written_is_not_kept(serve) -> None:
    async def answers_unread(received: Received, writer: asyncio.StreamWriter) -> None:
        writer.write(answer())
        await writer.drain()
        await asyncio.sleep(30)  # and never reads the rest of the body

    server = await serve(answers_unread, read_body=False)
    one = HttpClient.open(timedelta(seconds=TIMEOUT), connections=1)
    try:
        assert (await one.post(f"{server.url}/a", json="x" * 32_000_000)).status_code == 200

        # Then the next call does not queue behind the unsent bytes (TimedOut: "it may have acted", wrongly)
        server.script = ok
        assert (await one.post(f"{server.url}/b", json={})).status_code == 201
        assert server.connections == 2
    finally:
        await one.close()


# ---------------------------------------------------------------- closing the client


async def test_closing_the_client_ends_a_call_whose_request_is_still_being_written(serve) -> None:
    server = await serve(silent, read_body=False)
    one = HttpClient.open(timedelta(seconds=TIMEOUT), connections=1)
    call = asyncio.create_task(one.post(f"{server.url}/payments", json="x" * 32_000_000))
    await server.received(1)

    await one.close()

    with pytest.raises(Cut):
        await asyncio.wait_for(call, 6 * TIMEOUT)


async def test_a_call_waiting_for_a_free_connection_when_the_client_closes_fails_to_connect(serve) -> None:
    server = await serve(silent)
    one = HttpClient.open(timedelta(seconds=5), connections=1)
    held = asyncio.create_task(one.post(f"{server.url}/a", json={}))
    await server.received(1)
    waiting = asyncio.create_task(one.post(f"{server.url}/b", json={}))
    await asyncio.sleep(0)  # one turn of the loop: the second call reaches the full pool and waits there
    await one.close()

    with pytest.raises(Cut):
        await held
    with pytest.raises(ConnectFailed):
        await waiting
    assert server.connections == 1


# ---------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, by the openssl command line."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def tls(certificate: tuple[Path, Path]) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The server's context, and a client's that trusts its certificate."""
    cert, key = certificate
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(cert))


async def test_an_untrusted_certificate_fails_to_connect(serve, client: HttpClient, tls) -> None:
    server = await serve(ok, tls=tls[0])

    with pytest.raises(ConnectFailed) as failed:
        await client.get(f"https://127.0.0.1:{server.port}/x")

    assert failed.value.timed_out is False
    assert server.requests == []


async def test_calls_over_tls_share_a_kept_alive_connection(serve, client: HttpClient, tls) -> None:
    server = await serve(ok, tls=tls[0])

    for _ in range(3):
        assert (await client.get(f"https://127.0.0.1:{server.port}/x", tls=tls[1])).status_code == 201

    assert server.connections == 1


@pytest.mark.parametrize("close_notify", [True, False], ids=["close-notify", "dropped"])
async def test_a_tls_connection_the_server_ended_while_idle_is_not_handed_out(
    serve, client: HttpClient, tls, monkeypatch, close_notify: bool
) -> None:
    async def answers_and_ends(received: Received, writer: asyncio.StreamWriter) -> None:
        writer.write(answer())
        await writer.drain()
        if close_notify:
            writer.close()
        else:
            writer.transport.abort()  # the TCP connection ends without TLS's close_notify

    server = await serve(answers_and_ends, tls=tls[0])
    url = f"https://127.0.0.1:{server.port}/x"
    assert (await client.get(url, tls=tls[1])).status_code == 200

    async def ended() -> bool:
        return server.ended == 1

    await eventually(ended, timeout=5, interval=0.01)

    assert (await client.post(url, json={}, tls=tls[1])).status_code == 200, "the ended connection was handed out"
    assert server.connections == 2


async def test_closing_the_client_ends_a_tls_call_at_once(tls) -> None:
    # A server that takes the request and then neither answers nor reads (a thread: asyncio's server would read)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    release, received = threading.Event(), threading.Event()

    def busy() -> None:
        connection, _ = listener.accept()
        with tls[0].wrap_socket(connection, server_side=True) as wrapped:
            data = b""
            while b"\r\n\r\n" not in data:
                data += wrapped.recv(65536)
            received.set()
            release.wait(30)

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    one = HttpClient.open(timedelta(seconds=5), connections=1)
    call = asyncio.create_task(one.get(f"https://127.0.0.1:{port}/x", tls=tls[1]))
    try:

        async def under_way() -> bool:
            return received.is_set()

        await eventually(under_way, timeout=5, interval=0.01)

        await one.close()

        # Then at once, not after TLS's 30 s wait for the server's close_notify
        with pytest.raises(Cut):
            await asyncio.wait_for(call, 2)
    finally:
        release.set()
        listener.close()
