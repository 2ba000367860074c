"""Structured JSON logs (structlog) for the service and the libraries it uses.

At the default level no stack trace is written: a failing record logs its ids and error code, an outage
logs one line per retry. Stack traces appear only with <PREFIX>LOG_LEVEL=debug.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from typing import Any

import orjson
import structlog

from service.policy import backoff

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def _drop_stack_traces(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    event.pop("exc_info", None)
    event.pop("stack_info", None)
    return event


def _dumps(event: dict[str, Any], **options: Any) -> str:
    """One JSON line, by orjson (several times faster than json.dumps; a round logs one line per duplicate)."""
    return orjson.dumps(event, default=options.get("default")).decode()


class _NamedWriteLogger(structlog.WriteLogger):
    """Writes lines to stderr and knows its name, for `logger`: the service's root and the part's name
    (`get_logger("consumer")` logs as `<root>.consumer`)."""

    def __init__(self, root: str, name: str = "", *_: Any) -> None:
        super().__init__(sys.stderr)
        self.name = f"{root}.{name}" if root and name else root or name


# aiokafka's lines for a broker it cannot connect to at start, or that names only a node id: the service says it
# itself, with the cause aiokafka keeps to its log (`kafka_unavailable`, `kafka_fetch_refused`, a short command's one
# line: service/adapters/kafka.py `diagnose`), once per retry; a short command's output stays one line. The mid-run
# form ("Unable connect to node with id …") is thinned below.
_CONNECTION_CHATTER = ('Unable connect to "', "Unable to update metadata from ")


def _no_node(record: logging.LogRecord) -> bool:
    """aiokafka's "Unable connect to node with id …: StaleMetadata": metadata that names no such broker (a broker
    that refused the client's OAuth token answers so), which the service's own line explains."""
    args = record.args
    stale = isinstance(args, tuple) and len(args) > 1 and type(args[1]).__name__ == "StaleMetadata"
    return stale and str(record.msg).startswith("Unable connect to node with id")


class _KafkaChatter(logging.Filter):
    """aiokafka's lines during an outage, thinned: a running client retries every ~100 ms and logs each retry
    (about 60 lines a second for one consumer). Each kind of line (logger and message template) passes once,
    then again after 1 s, 2 s, 4 s … up to a minute, saying how many like it were held back meanwhile; a kind
    quiet for five minutes starts over."""

    _FIRST, _LONGEST, _QUIET = 1.0, 60.0, 300.0

    def __init__(self) -> None:
        super().__init__()
        self._seen: dict[tuple[str, str], list[float]] = {}  # kind → [next allowed, passed, held back, last]

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a line that is dropped or held back; the line that passes carries the held-back count."""
        if not record.name.startswith("aiokafka"):
            return True
        template = str(record.msg)
        if template.startswith(_CONNECTION_CHATTER) or _no_node(record):
            return False
        now = time.monotonic()
        kind = (record.name, template)
        state = self._seen.get(kind)
        if state is None or now - state[3] > self._QUIET:
            self._seen[kind] = [now + self._FIRST, 1, 0, now]
            return True
        state[3] = now
        if now < state[0]:
            state[2] += 1
            return False
        held, state[2] = int(state[2]), 0
        state[1] += 1
        state[0] = now + backoff.exponential(self._FIRST, int(state[1]), self._LONGEST)
        if held:
            record.msg = f"{template} ({held} like it held back)"
        return True


def configure(level: str, logger_root: str = "") -> None:
    """Route structlog and stdlib logging to one JSON line per event on stderr; the service's own loggers are named
    below `logger_root` (the domain's)."""
    numeric = _LEVELS[level]
    debug = numeric <= logging.DEBUG
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    shared.append(structlog.processors.format_exc_info if debug else _drop_stack_traces)
    renderer = structlog.processors.JSONRenderer(serializer=_dumps)
    # Our own events skip the stdlib logging machinery (a consumer logs one line per duplicate or failure, and
    # that machinery cost more than the rest of the line); the libraries' stdlib records go through a handler
    # that renders them the same way.
    structlog.configure(
        processors=[*shared, renderer],
        logger_factory=functools.partial(_NamedWriteLogger, logger_root),
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[structlog.stdlib.add_log_level, *shared[1:]],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    # Client libraries retry on their own and would log every reconnect: keep their errors, not their chatter.
    for noisy in ("aiokafka", "kafka", "sqlalchemy", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if debug else logging.ERROR)
    if not debug:
        handler.addFilter(_KafkaChatter())
    # Alembic talks at info whenever a process reads the schema revision; `migrate` turns it back up itself.
    logging.getLogger("alembic").setLevel(logging.DEBUG if debug else logging.WARNING)
