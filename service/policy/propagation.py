"""Which header of an outbox row carries the span context of its `send` (W3C Trace Context); pure.

A message the service writes itself (an event, a rejection, a quarantine envelope) gets `traceparent`: its readers
continue the service's trace. A copy of a producer's record (a retry tier's, a reprocess or an edit's) keeps every
header of the producer byte-exact, its `traceparent` included, and carries the context in the service's own
`SPAN_HEADER` instead, so that the next attempt links to the one that sent it (service/policy/traces.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from service.policy.traces import SPAN_HEADER

TRACEPARENT = "traceparent"


def replaced(headers: Iterable[tuple[str, bytes]], name: str, value: bytes) -> tuple[tuple[str, bytes], ...]:
    """`headers` with `name` set to `value`: in the place of its first occurrence (the others dropped), else last;
    every other header as it was, in its order."""
    written: list[tuple[str, bytes]] = []
    placed = False
    for header, old in headers:
        if header != name:
            written.append((header, old))
        elif not placed:
            written.append((name, value))
            placed = True
    if not placed:
        written.append((name, value))
    return tuple(written)


def propagated(headers: Iterable[tuple[str, bytes]], *, copy: bool, context: str) -> tuple[tuple[str, bytes], ...]:
    """The headers a row goes out with whose `send` span has the `traceparent` text `context`: a copy's in
    `SPAN_HEADER`, a new message's in `traceparent`."""
    return replaced(headers, SPAN_HEADER if copy else TRACEPARENT, context.encode())
