"""A long-running process's start-up check of its topics (contract §11): it waits, with backoff, until every topic it
reads and writes exists and may be described, saying so once per backoff step, and is not ready meanwhile. No crash
loop while a `topics apply` Job runs: the process starts working when the topics appear.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import structlog
from aiokafka.errors import KafkaError

from service.adapters import topics
from service.errors import TokenUnavailable, TopicsProblem
from service.explain import Names, explain
from service.policy import backoff
from service.policy.topics import not_ready_line
from service.stopping import sleep_unless_stopped

log = structlog.get_logger("topics")

Look = Callable[[Sequence[str]], Awaitable[topics.Found]]  # which of the names the broker lacks or will not describe
_FIRST_DELAY_SECONDS = 1.0
_LONGEST_DELAY_SECONDS = 30.0  # the longest a process keeps working after `topics apply` made its topics


class TopicsCheck:
    """The process's start-up check; `ready` is what /readyz says of it (service/containers.py)."""

    def __init__(self, look: Look, *, source: str, program: str, names: Names) -> None:
        self._look = look
        self._source = source  # the source topic: its producers, not `topics apply`, create it
        self._program = program  # the console script a fix names
        self._names = names  # the settings whose variables a failure's line names
        self.ready = True  # a process that checks nothing (effects) waits for nothing
        self.problem: str | None = None  # while topics are missing or may not be described: the fix, in a line

    async def wait(self, names: Sequence[str], stop: asyncio.Event) -> bool:
        """Return True once every one of `names` exists and may be described; False when stopped first."""
        if not names:
            return True
        self.ready = False
        looks = 0  # looks that did not find them all
        while not stop.is_set():
            delay = backoff.exponential(_FIRST_DELAY_SECONDS, looks + 1, _LONGEST_DELAY_SECONDS)
            try:
                found = await self._look(names)
            except (KafkaError, OSError, TimeoutError, TokenUnavailable) as error:
                # The broker, a login it refuses, a certificate, a token endpoint that gives no token: an outage to
                # wait out, not a crash (contract §11), said in the line a short command would exit with.
                self.problem = explain(error, self._names)
                log.warning(
                    "kafka_unavailable",
                    client="topics check",
                    error=type(error).__name__,
                    reason=self.problem,
                    retry_in_seconds=delay,
                )
            except TopicsProblem as error:  # an answer about a topic that is neither "missing" nor "not authorized"
                self.problem = str(error)
                log.warning("topics_check_failed", error=self.problem, retry_in_seconds=delay)
            else:
                if found.complete:
                    self.ready, self.problem = True, None
                    if looks:  # said missing before: say they are there now
                        log.info("topics_found", topics=list(names))
                    return True
                self.problem = not_ready_line(
                    found.missing, found.not_authorized, source=self._source, program=self._program
                )
                log.warning(
                    "topics_missing",
                    missing=list(found.missing),
                    not_authorized=[f"DESCRIBE on topic {name}" for name in found.not_authorized],
                    fix=self.problem,
                    retry_in_seconds=delay,
                )
            await sleep_unless_stopped(stop, delay)
            looks += 1
        return False
