"""The process's HTTP client against a real TCP server that answers as scripted: keep-alive, every way an answer can
be framed, and every way an exchange can end short, each as the error that says how far it got."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.adapters import http1
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
    """Reads requests on each connection and plays `script` for each; counts connections and requests."""

    script: Script
    connections: int = 0
    requests: list[Received] = field(default_factory=list)
    port: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
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
                received = Received(head, await reader.readexactly(length))
                self.requests.append(received)
                await self.script(received, writer)
                if writer.is_closing():
                    return
        finally:
            writer.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def received(self, count: int) -> None:
        async def arrived() -> bool:
            return len(self.requests) >= count

        await eventually(arrived, timeout=5, interval=0.01)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Script], Awaitable[Server]]]:
    servers: list[asyncio.Server] = []

    async def start(script: Script) -> Server:
        server = Server(script)
        listening = await asyncio.start_server(server.serve, "127.0.0.1", 0)
        server.port = listening.sockets[0].getsockname()[1]
        servers.append(listening)
        return server

    yield start
    for listening in servers:
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


async def test_an_answer_ended_by_its_connection_is_not_kept_and_the_next_call_connects_again(
    serve, client: HttpClient
) -> None:
    server = await serve(sends(b"HTTP/1.1 200 OK\r\n\r\nall of it", then_close=True))

    assert (await client.get(f"{server.url}/x")).content == b"all of it"
    assert (await client.get(f"{server.url}/x")).content == b"all of it"

    assert server.connections == 2


async def test_a_connection_the_server_closed_while_idle_is_not_used_again(serve, client: HttpClient) -> None:
    server = await serve(sends(answer(), then_close=True))  # Content-Length, then the server closes

    for _ in range(3):
        assert (await client.get(f"{server.url}/x")).status_code == 200

        async def noticed() -> bool:  # the client has seen the close: no kept connection is usable
            return not any(kept.usable for idle in client._pool._idle.values() for kept in idle)

        await eventually(noticed, timeout=5, interval=0.01)

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
    monkeypatch.setattr(http1, "MAX_ANSWER_BYTES", 1000)
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
    """An answer a byte at a time, each within the timeout: the call is slow, never silent."""
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
        assert (await held).status_code == 200, "a slow answer is not a silent one"
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
