"""A fake-API server run as a process of its own: its base URL the only line on stdout, until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from types import FrameType
from typing import Protocol


class Served(AbstractContextManager["Served"], Protocol):
    """A server that listens while its context is open (service/testing/faults.py's `FaultServer`)."""

    @property
    def url(self) -> str:
        """The base URL it answers on."""
        ...


def serve_from_command_line(
    build: Callable[[str, int], Served], prog: str, description: str, argv: Sequence[str] | None = None
) -> int:
    """Serve `build(host, port)` until SIGTERM or SIGINT, after printing the base URL as the only stdout line."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one (default)")
    args = parser.parse_args(argv)

    stop_requested = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        """Only flag the stop: the main thread shuts the server down outside the signal handler."""
        stop_requested.set()

    # Installed before the URL is printed: a caller may send SIGTERM as soon as it has read the line.
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    with build(args.host, args.port) as server:
        print(server.url, flush=True)
        stop_requested.wait()
    return 0
