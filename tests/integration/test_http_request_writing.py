"""What a provider's id or a message can put into a request: the client writes it as asked, or refuses it before a
byte leaves. A real TCP server reads what arrives with an HTTP server's parser (httptools, uvicorn's)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import httptools
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from service.adapters.http import ConnectFailed, HttpClient


class _Parsed:
    """What an HTTP server's parser reads from a request."""

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


async def _post(target: str, key: str) -> _Parsed | None:
    """POST `{"a": 1}` to `target` with this Idempotency-Key; what the server read, or None when the client refused
    the request (and then no connection was made)."""
    parsed = _Parsed()
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        parser = httptools.HttpRequestParser(parsed)
        while not parsed.complete and (data := await reader.read(65536)):
            parser.feed_data(data)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    listening = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    client = HttpClient.open(timedelta(seconds=2), connections=1)
    try:
        await client.post(f"http://127.0.0.1:{port}{target}", json={"a": 1}, headers={"Idempotency-Key": key})
    except ConnectFailed:
        assert connections == 0, "a refused request made a connection"
        return None
    finally:
        await client.close()
        listening.close()
    return parsed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.text(), target=st.text(min_size=1).map(lambda text: "/" + text))
@example(key="0\t", target="/")  # a server's parser keeps a trailing tab: the writer leaves it out
@example(key="0\xa0", target="/")  # not whitespace to HTTP
@example(key="k", target="/./a/../b")  # dot segments are sent as they are
@example(key="", target="/?")  # an empty query: the URL library (yarl) leaves its `?` out
def test_a_request_is_written_as_asked_or_refused_before_a_byte_leaves(key: str, target: str) -> None:
    # Given an idempotency key and a path from a message: any text at all
    # When a call is made with them
    parsed = asyncio.run(asyncio.wait_for(_post(target, key), 10))

    sent = target.partition("#")[0]  # a fragment is the client's alone (RFC 9110 §4.2.5)
    if sent.endswith("?") and sent.count("?") == 1:
        sent = sent[:-1]  # an empty query names the same resource to the APIs; yarl leaves the `?` out
    if parsed is None:
        # Then either it is refused whole (a control character, a target that is not percent-encoded) ...
        assert (
            any((ord(c) < 32 and c != "\t") or c == "\x7f" for c in key)
            or not sent.isascii()
            or any(ord(c) <= 32 or c == "\x7f" for c in sent)
        )
        return
    # ... or a server reads back exactly that request: one Idempotency-Key, that target, that body
    assert parsed.complete
    assert parsed.url == sent.encode()
    assert [value for name, value in parsed.headers if name.lower() == b"idempotency-key"] == [
        key.strip(" \t").encode()
    ]
    assert parsed.body == b'{"a":1}'
