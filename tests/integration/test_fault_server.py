"""The generic fault-injection server serves mounted routes and injects the faults and latency tests ask for.

The routes are a tiny notes API defined here, so these tests hold for any domain's fake API.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from service.testing import serving
from service.testing.faults import (
    FakeApi,
    FaultServer,
    Reply,
    Request,
    Route,
    json_field,
    json_reply,
    key_from_body,
    key_from_param,
)
from tests.support import eventually, wait_until


class Notes:
    """A tiny fake API: notes stored by id, one control to add a note, its notes in the state."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.notes: dict[str, str] = {}

    def api(self) -> FakeApi:
        return FakeApi(
            routes=(
                Route("notes.post", "POST", "/notes", self.post, key_from_body("id")),
                Route("notes.get", "GET", "/notes/{id}", self.get, key_from_param("id")),
                Route("notes.delete", "DELETE", "/notes/{id}", self.delete, key_from_param("id")),
                Route("notes.list", "GET", "/notes", lambda _: json_reply(200, self.stored())),
            ),
            controls={"notes": lambda payload: self.add(json_field(payload, "id", str), "from control")},
            snapshot=lambda: {"notes": self.stored()},
            reset=self.notes.clear,
        )

    def add(self, note_id: str, text: str) -> None:
        with self.lock:
            self.notes[note_id] = text

    def stored(self) -> dict[str, str]:
        with self.lock:
            return dict(self.notes)

    def post(self, request: Request) -> Reply:
        payload = request.payload or {}
        if not isinstance(payload.get("id"), str):
            return json_reply(400, {"error": "id must be a string"})
        self.add(payload["id"], str(payload.get("text", "")))
        return json_reply(201, {"id": payload["id"]})

    def get(self, request: Request) -> Reply:
        text = self.stored().get(request.params["id"])
        return json_reply(404, {}) if text is None else json_reply(200, {"text": text})

    def delete(self, request: Request) -> Reply:
        with self.lock:
            self.notes.pop(request.params["id"], None)
        return Reply(204, b"")


@pytest.fixture
def notes() -> Notes:
    return Notes()


@pytest.fixture
def server(notes: Notes) -> Iterator[FaultServer]:
    """A started server with the notes API mounted, stopped after the test."""
    with FaultServer(apis=[notes.api()]) as started:
        yield started


@pytest.fixture
def client(server: FaultServer) -> Iterator[httpx.Client]:
    """A keep-alive client on the server; trust_env=False so a proxy in the environment cannot interfere."""
    with httpx.Client(base_url=server.url, timeout=2.0, trust_env=False) as http:
        yield http


def short_timeout_client(server: FaultServer) -> httpx.Client:
    """A client that gives up after 0.2 s, like a service with a tight deadline."""
    return httpx.Client(base_url=server.url, timeout=0.2, trust_env=False)


def post_note(client: httpx.Client, note_id: str = "n-1") -> httpx.Response:
    return client.post("/notes", json={"id": note_id, "text": "hello"})


def timed(call: Callable[[], httpx.Response]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    return call(), time.monotonic() - started


def address(server: FaultServer) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def exchange(server: FaultServer, raw: bytes) -> bytes:
    """Send raw bytes on a fresh connection and read until the server closes it (a socket timeout if never)."""
    with socket.create_connection(address(server), timeout=2.0) as connection:
        connection.sendall(raw)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
    return received


async def get_and_close(server: FaultServer, path: str) -> bytes:
    """GET a path on a fresh asyncio connection asking to close, and read until EOF (no thread on our side)."""
    reader, writer = await asyncio.open_connection(*address(server))
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n".encode())
        return await reader.read()
    finally:
        writer.close()


def echo_api() -> FakeApi:
    """An API answering its request's query and headers back, to see what the server parsed."""
    return FakeApi(
        routes=[Route("echo.get", "GET", "/echo", lambda r: json_reply(200, {"query": r.query, "headers": r.headers}))]
    )


# -- lifecycle and routing ---------------------------------------------------------------------------------


def test_start_returns_the_base_url_and_stop_closes_the_port(notes: Notes) -> None:
    server = FaultServer(apis=[notes.api()])
    url = server.start()
    assert url == server.url
    assert url.startswith("http://127.0.0.1:")
    with pytest.raises(RuntimeError, match="already started"):
        server.start()
    with httpx.Client(trust_env=False) as http:
        assert http.get(f"{url}/notes").status_code == 200
        server.stop()
        server.stop()  # a second stop is harmless
        with pytest.raises(httpx.ConnectError):
            http.get(f"{url}/notes")
    with pytest.raises(RuntimeError, match="not started"):
        _ = server.url


def test_a_route_gets_its_decoded_placeholders_and_serves_any_method(
    server: FaultServer, notes: Notes, client: httpx.Client
) -> None:
    notes.add("a/b c", "slashed")
    assert client.get("/notes/a%2Fb%20c").json() == {"text": "slashed"}
    assert client.delete("/notes/a%2Fb%20c").status_code == 204
    assert notes.stored() == {}
    assert server.routes == ("notes.post", "notes.get", "notes.delete", "notes.list")


def test_an_unknown_path_is_not_found_and_a_known_one_with_another_method_not_allowed(client: httpx.Client) -> None:
    assert (client.get("/nowhere").status_code, client.get("/notes/a/b").status_code) == (404, 404)
    refused = client.put("/notes/n-1")
    assert (refused.status_code, refused.headers["allow"]) == (405, "DELETE, GET")


@pytest.mark.parametrize(
    ("api", "problem"),
    [
        (FakeApi(routes=[Route("notes.get", "GET", "/other", lambda _: Reply(200, b""))]), "exists already"),
        (FakeApi(routes=[Route("other.get", "GET", "/notes/{id}", lambda _: Reply(200, b""))]), "already"),
        (FakeApi(routes=[Route("x", "HEAD", "/x", lambda _: Reply(200, b""))]), "method"),
        (FakeApi(routes=[Route("x", "GET", "/_control/x", lambda _: Reply(200, b""))]), "starts with"),
        (FakeApi(routes=[Route("x", "GET", "/x/{a}/{a}", lambda _: Reply(200, b""))]), "twice"),
        (FakeApi(routes=[], controls={"faults": lambda _: None}), "control names"),
    ],
)
def test_a_mount_that_clashes_is_rejected_and_changes_nothing(
    server: FaultServer, client: httpx.Client, api: FakeApi, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        server.mount(api)
    assert server.routes == ("notes.post", "notes.get", "notes.delete", "notes.list")
    assert client.get("/other").status_code == 404


def test_two_apis_share_one_server(server: FaultServer, client: httpx.Client) -> None:
    echo = FakeApi(
        routes=[Route("echo.get", "GET", "/echo/{word}", lambda request: json_reply(200, request.params))],
        snapshot=lambda: {"echoes": 0},
    )
    server.mount(echo)
    server.fail_next("echo.get")
    assert client.get("/echo/hi").status_code == 503
    assert client.get("/echo/hi").json() == {"word": "hi"}
    assert post_note(client).status_code == 201
    state = server.state()
    assert state["calls"]["echo.get"] == {"": 2}
    assert (state["echoes"], state["notes"]) == (0, {"n-1": "hello"})


# -- faults ------------------------------------------------------------------------------------------------


def test_fail_next_answers_the_injected_status_retry_after_and_body_without_side_effect(
    server: FaultServer, notes: Notes, client: httpx.Client
) -> None:
    server.fail_next("notes.post", status=429, retry_after=2, body={"error": "slow down"})
    failed = post_note(client)
    assert (failed.status_code, failed.headers["retry-after"], failed.json()) == (429, "2", {"error": "slow down"})
    assert notes.stored() == {}
    assert post_note(client).status_code == 201
    assert server.calls("notes.post", "n-1") == 2


def test_fail_next_defaults_to_503_with_an_injected_error_body(server: FaultServer, client: httpx.Client) -> None:
    server.fail_next("notes.list")
    server.fail_next("notes.list", retry_after=1.5)
    response = client.get("/notes")
    assert (response.status_code, response.json()) == (503, {"error": "injected"})
    assert "retry-after" not in response.headers
    assert client.get("/notes").headers["retry-after"] == "1.5"


def test_faults_apply_to_the_next_calls_of_their_route_in_fifo_order(server: FaultServer, client: httpx.Client) -> None:
    server.fail_next("notes.list", times=2, status=503)
    server.fail_next("notes.list", status=500)
    assert post_note(client).status_code == 201  # another route is unaffected
    assert [client.get("/notes").status_code for _ in range(4)] == [503, 503, 500, 200]


def test_a_fault_for_one_key_waits_for_a_call_with_that_key(
    server: FaultServer, notes: Notes, client: httpx.Client
) -> None:
    server.fail_next("notes.post", status=500, key="n-2")
    server.cut_next("notes.get", key="n-2")
    assert post_note(client, "n-1").status_code == 201
    assert post_note(client, "n-2").status_code == 500
    assert post_note(client, "n-2").status_code == 201
    assert client.get("/notes/n-1").status_code == 200
    with pytest.raises(httpx.TransportError):
        client.get("/notes/n-2")
    assert set(notes.stored()) == {"n-1", "n-2"}


def test_clear_faults_drops_every_queued_fault(server: FaultServer, client: httpx.Client) -> None:
    server.fail_next("notes.list", times=3)
    server.cut_next("notes.post")
    server.clear_faults()
    assert client.get("/notes").status_code == 200
    assert post_note(client).status_code == 201


@pytest.mark.parametrize(
    ("queue", "problem"),
    [
        (lambda server: server.fail_next("note.post"), "unknown route 'note.post'; expected one of notes.post"),
        (lambda server: server.delay_next("notes.post", times=0), "times"),
        (lambda server: server.fail_next("notes.post", status=204), "cannot carry"),
        (lambda server: server.fail_next("notes.post", status=99), "status"),
        (lambda server: server.fail_next("notes.post", body={1, 2}), "JSON"),
        (lambda server: server.delay_next("notes.post", seconds=-1), "seconds"),
        (lambda server: server.set_latency("notes.post", -0.1), "seconds"),
        (lambda server: server.set_latency("nope", 1), "unknown route"),
    ],
)
def test_an_invalid_fault_or_latency_is_rejected(
    server: FaultServer, queue: Callable[[FaultServer], None], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        queue(server)


def test_a_delayed_call_is_applied_although_the_client_times_out(server: FaultServer, notes: Notes) -> None:
    # A long delay costs nothing: stopping the server wakes the sleeping handler.
    server.delay_next("notes.post", seconds=5.0)
    with short_timeout_client(server) as http, pytest.raises(httpx.ReadTimeout):
        post_note(http)
    assert wait_until(lambda: "n-1" in notes.stored())
    # The delayed handler is still sleeping, yet other requests are answered within the short timeout.
    with short_timeout_client(server) as http:
        assert http.get("/notes/n-1").status_code == 200


@pytest.mark.parametrize(("after_apply", "stored"), [(True, {"n-1": "hello"}), (False, {})])
def test_a_cut_drops_the_connection_after_or_before_applying_the_call(
    server: FaultServer, notes: Notes, client: httpx.Client, after_apply: bool, stored: dict[str, str]
) -> None:
    server.cut_next("notes.post", after_apply=after_apply)
    with pytest.raises(httpx.TransportError):
        post_note(client)
    assert notes.stored() == stored
    assert server.calls("notes.post", "n-1") == 1
    assert post_note(client).status_code == 201


def test_stop_wakes_delayed_answers_instead_of_waiting_for_them(notes: Notes) -> None:
    server = FaultServer(apis=[notes.api()])
    server.start()
    server.delay_next("notes.list", seconds=60.0)
    server.set_latency("notes.get", 60.0)
    with httpx.Client(base_url=server.url, timeout=30.0, trust_env=False) as http, ThreadPoolExecutor(2) as pool:
        waiting = [pool.submit(http.get, path) for path in ("/notes", "/notes/n-1")]
        assert wait_until(lambda: server.calls("notes.list") + server.calls("notes.get") == 2)
        started = time.monotonic()
        server.stop()
        for future in waiting:
            assert isinstance(future.exception(timeout=10.0), httpx.RemoteProtocolError)
        assert time.monotonic() - started < 10.0


async def test_stop_while_a_hundred_calls_wait_closes_them_all_unanswered_and_returns_promptly(
    server: FaultServer,
) -> None:
    server.set_latency("notes.list", 60.0)
    calls = [asyncio.ensure_future(get_and_close(server, "/notes")) for _ in range(100)]

    async def all_waiting() -> bool:
        return server.calls("notes.list") == 100

    await eventually(all_waiting, timeout=10.0, interval=0.01)
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 2.0
    assert await asyncio.wait_for(asyncio.gather(*calls), timeout=5.0) == [b""] * 100


def test_a_handler_that_raises_answers_500_and_closes_its_connection(server: FaultServer) -> None:
    def broken(request: Request) -> Reply:
        raise RuntimeError("a bug in a fake")

    server.mount(FakeApi(routes=[Route("broken.get", "GET", "/broken", broken)]))
    answer = exchange(server, b"GET /broken HTTP/1.1\r\nHost: test\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 500 ")
    assert b"\r\nConnection: close\r\n" in answer
    assert server.calls("broken.get") == 1


# -- latency -----------------------------------------------------------------------------------------------


def test_a_route_latency_slows_every_call_of_that_route_only(server: FaultServer, client: httpx.Client) -> None:
    server.set_latency("notes.get", 0.2)
    post_note(client)
    for _ in range(2):
        response, elapsed = timed(lambda: client.get("/notes/n-1"))
        assert response.status_code == 200
        assert 0.2 <= elapsed < 2.0
    assert (server.latency("notes.get"), server.latency("notes.post")) == (0.2, 0.0)


def test_a_latency_adds_to_a_fault(server: FaultServer, client: httpx.Client) -> None:
    server.set_latency("notes.list", 0.2)
    server.fail_next("notes.list", status=500)
    server.delay_next("notes.list", seconds=0.2)
    failed, elapsed = timed(lambda: client.get("/notes"))
    assert failed.status_code == 500
    assert elapsed >= 0.2
    delayed, elapsed = timed(lambda: client.get("/notes"))
    assert delayed.status_code == 200
    assert elapsed >= 0.4


def test_a_latency_of_zero_removes_it_and_a_reset_forgets_latencies_faults_counts_and_state(
    server: FaultServer, notes: Notes, client: httpx.Client
) -> None:
    post_note(client)
    server.set_latency("notes.list", 5.0)
    server.set_latency("notes.list", 0)
    assert server.latency("notes.list") == 0.0
    server.set_latency("notes.get", 5.0)
    server.fail_next("notes.get")
    server.reset()
    assert (server.latency("notes.get"), server.calls("notes.post"), notes.stored()) == (0.0, 0, {})
    with short_timeout_client(server) as http:
        assert http.get("/notes/n-1").status_code == 404


async def test_a_thousand_calls_at_a_latency_are_answered_together_on_the_servers_one_thread(
    server: FaultServer,
) -> None:
    server.set_latency("notes.list", 0.5)
    threads_before = threading.active_count()
    started = time.monotonic()
    calls = [asyncio.ensure_future(get_and_close(server, "/notes")) for _ in range(1000)]

    async def all_waiting() -> bool:
        return server.calls("notes.list") == 1000

    await eventually(all_waiting, timeout=10.0, interval=0.01)
    threads_while_waiting = threading.active_count()
    answers = await asyncio.wait_for(asyncio.gather(*calls), timeout=10.0)
    elapsed = time.monotonic() - started
    assert all(answer.startswith(b"HTTP/1.1 200 ") for answer in answers)
    # One at a time this would take 500 s; a thread per waiting call would show here as a thousand threads.
    assert 0.5 <= elapsed < 5.0
    assert threads_while_waiting == threads_before


# -- keep-alive and framing --------------------------------------------------------------------------------


def test_two_requests_reuse_one_keep_alive_connection(server: FaultServer) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    with contextlib.closing(http.client.HTTPConnection("127.0.0.1", port, timeout=2.0)) as connection:
        connection.request("POST", "/notes", body=b'{"id": "n-1"}', headers={"Content-Type": "application/json"})
        first = connection.getresponse()
        assert (first.status, first.read(), first.getheader("Connection")) == (201, b'{"id": "n-1"}', None)
        socket_after_first = connection.sock
        connection.request("GET", "/notes/n-1")
        second = connection.getresponse()
        assert (second.status, second.read()) == (200, b'{"text": ""}')
        # http.client opens a new socket when the server closed the first one
        assert socket_after_first is not None
        assert connection.sock is socket_after_first


def test_a_request_without_content_length_is_refused_and_its_connection_closed(server: FaultServer) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"id": "n-1"}'

    with httpx.Client(base_url=server.url, timeout=2.0, trust_env=False) as http:
        response = http.post("/notes", content=chunks())
    assert (response.status_code, response.headers["connection"]) == (411, "close")
    assert server.calls("notes.post") == 0


def test_a_request_with_an_invalid_content_length_is_refused_and_its_connection_closed(server: FaultServer) -> None:
    answer = exchange(server, b"POST /notes HTTP/1.1\r\nHost: test\r\nContent-Length: ten\r\n\r\n")
    # (aiohttp answers a request it could not read as HTTP/1.0, whose connections close after one answer)
    assert answer.startswith(b"HTTP/1.0 400 ") or (
        answer.startswith(b"HTTP/1.1 400 ") and b"\r\nConnection: close\r\n" in answer
    )
    assert server.calls("notes.post") == 0


@pytest.mark.parametrize(
    ("version", "header"),
    [("HTTP/1.1", "Connection: close\r\n"), ("HTTP/1.0", ""), ("HTTP/1.1", "CONNECTION: Close\r\n")],
)
def test_a_client_that_does_not_keep_alive_gets_one_answer_and_the_connection_closes(
    server: FaultServer, version: str, header: str
) -> None:
    answer = exchange(server, f"GET /notes {version}\r\nHost: test\r\n{header}\r\n".encode())
    assert answer.startswith(f"{version} 200 ".encode())  # an HTTP/1.0 client is answered in its version
    assert answer.count(b"HTTP/1.") == 1
    assert answer.endswith(b"\r\n\r\n{}")


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(
    notes: Notes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serving, "_IDLE_CONNECTION_TIMEOUT_S", 0.2)
    with FaultServer(apis=[notes.api()]) as server:
        started = time.monotonic()
        answer = exchange(server, b"GET /notes HTTP/1.1\r\nHost: test\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert 0.2 <= time.monotonic() - started < 2.0


def test_an_unsupported_method_is_refused_and_its_connection_closed(server: FaultServer) -> None:
    answer = exchange(server, b"HEAD /notes HTTP/1.1\r\nHost: test\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 501 ")
    assert b"\r\nConnection: close\r\n" in answer


def test_header_names_are_case_insensitive_the_first_value_wins_and_blank_query_values_are_kept(
    server: FaultServer,
) -> None:
    server.mount(echo_api())
    with httpx.Client(base_url=server.url, timeout=2.0, trust_env=False) as http:
        echoed = http.get(
            "/echo?ref=&a=1&a=2",
            headers=[("X-Tenant", "first"), ("x-tenant", "second"), ("Idempotency-KEY", "k-1")],
        ).json()
    assert echoed["query"] == {"ref": "", "a": "1"}
    assert (echoed["headers"]["x-tenant"], echoed["headers"]["idempotency-key"]) == ("first", "k-1")


# -- observation and control over HTTP ---------------------------------------------------------------------


def test_calls_are_counted_per_route_and_key_including_faulted_ones(server: FaultServer, client: httpx.Client) -> None:
    server.fail_next("notes.get")
    client.get("/notes/n-1")
    client.get("/notes/n-1")
    client.get("/notes/n-2")
    client.get("/notes")
    client.get("/nowhere")  # no route: not counted anywhere
    assert (server.calls("notes.get"), server.calls("notes.get", "n-1"), server.calls("notes.get", "n-3")) == (3, 2, 0)
    assert (server.calls("notes.list"), server.calls("notes.post")) == (1, 0)


def test_faults_and_latency_can_be_set_over_http(server: FaultServer, notes: Notes, client: httpx.Client) -> None:
    commands: list[tuple[str, Mapping[str, Any]]] = [
        ("faults", {"route": "notes.post", "kind": "fail", "status": 502, "retry_after": 1}),
        ("faults", {"route": "notes.post", "kind": "cut", "after_apply": False, "key": "n-1"}),
        ("faults", {"route": "notes.list", "kind": "delay", "seconds": 5}),
        ("latency", {"route": "notes.get", "seconds": 0.2}),
    ]
    for path, body in commands:
        assert client.post(f"/_control/{path}", json=body).json() == {"ok": True}
    failed = post_note(client)
    assert (failed.status_code, failed.headers["retry-after"]) == (502, "1")
    with pytest.raises(httpx.TransportError):
        post_note(client)
    assert notes.stored() == {}
    with short_timeout_client(server) as http, pytest.raises(httpx.ReadTimeout):
        http.get("/notes")
    assert server.latency("notes.get") == 0.2


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("faults", {"route": "nope", "kind": "fail"}),
        ("faults", {"route": "notes.post", "kind": "explode"}),
        ("faults", {"route": "notes.post", "kind": "fail", "times": "2"}),
        ("faults", {"route": "notes.post", "kind": "fail", "retry_after": True}),
        ("faults", {"route": "notes.post", "kind": "delay", "seconds": -1}),
        ("faults", {"route": "notes.post", "kind": "cut", "key": 7}),
        ("latency", {"route": "notes.post", "seconds": "fast"}),
        ("latency", {"route": "notes.post"}),
        ("notes", {"id": 1}),
        ("notes", ["not", "an", "object"]),
    ],
)
def test_an_invalid_control_body_is_rejected(
    server: FaultServer, client: httpx.Client, path: str, body: object
) -> None:
    response = client.post(f"/_control/{path}", json=body)
    assert response.status_code == 400
    assert post_note(client).status_code == 201
    assert server.latency("notes.post") == 0.0


def test_control_paths_answer_404_and_405_like_routes(client: httpx.Client) -> None:
    assert client.post("/_control/nowhere", json={}).status_code == 404
    assert client.get("/_control/faults").headers["allow"] == "POST"
    assert client.get("/_control/reset").status_code == 405
    assert client.post("/_control/state").headers["allow"] == "GET"


def test_a_mounted_control_the_state_and_reset_work_over_http(
    server: FaultServer, notes: Notes, client: httpx.Client
) -> None:
    assert client.post("/_control/notes", json={"id": "n-9"}).status_code == 200
    post_note(client)
    post_note(client)
    client.post("/notes", json={"text": "no id"})
    server.set_latency("notes.list", 0.5)
    state = client.get("/_control/state").json()
    assert state == {
        "notes": {"n-9": "from control", "n-1": "hello"},
        "calls": {"notes.post": {"n-1": 2, "": 1}, "notes.get": {}, "notes.delete": {}, "notes.list": {}},
        "latency": {"notes.list": 0.5},
    }
    assert client.post("/_control/reset").json() == {"ok": True}
    assert (notes.stored(), server.calls("notes.post"), server.latency("notes.list")) == ({}, 0, 0.0)
