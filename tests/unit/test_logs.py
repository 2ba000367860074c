"""Logging: aiokafka's outage chatter is thinned (issue 14: one line per retry, not sixty a second)."""

from __future__ import annotations

import logging

import pytest
from aiokafka.errors import StaleMetadata

from service import logs


def test_an_outage_of_aiokafka_lines_is_thinned_to_one_per_growing_interval_with_a_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: clock[0])
    chatter = logs._KafkaChatter()

    def line(
        name: str = "aiokafka.consumer.fetcher", msg: str = "Failed fetch messages from %s: %s"
    ) -> logging.LogRecord:
        return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, (1, "NodeNotReadyError"), None)

    # A running client retrying every 100 ms for 10 s: the first line passes, then one after 1 s, 2 s, 4 s …
    passed = []
    for _ in range(100):
        record = line()
        if chatter.filter(record):
            passed.append(record.getMessage())
        clock[0] += 0.1
    assert len(passed) == 4
    assert passed[0] == "Failed fetch messages from 1: NodeNotReadyError"
    assert passed[1].endswith("(9 like it held back)")
    # Another kind of line, our own lines and a start-up connection refusal are judged on their own
    assert chatter.filter(line(msg="Failed to commit %s"))
    assert not chatter.filter(line(name="aiokafka", msg="Unable to update metadata from %r"))  # names a node id only
    assert chatter.filter(line(name="order_service.consumer"))
    assert not chatter.filter(line(name="aiokafka", msg='Unable connect to "%s": %s'))  # at start: ours says it
    assert chatter.filter(line(name="aiokafka", msg="Unable connect to node with id %s: %s"))  # mid-run: thinned
    stale = logging.LogRecord(
        "aiokafka",
        logging.ERROR,
        __file__,
        1,
        "Unable connect to node with id %s: %s",
        ("bootstrap", StaleMetadata("x")),
        None,
    )
    assert not chatter.filter(stale)  # metadata naming no broker: ours says why
    # And a kind quiet for five minutes starts over
    clock[0] += 301
    assert chatter.filter(line())
