"""An operator's edit of a quarantined record, decided without I/O: the headers it asks for, the diff an auditor
reads, and whether the domain would take the corrected bytes (the consumer's own decoding) or quarantine them again.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from service.policy.handling import DecodeFailure
from service.policy.headers import Headers
from service.policy.records import text_of
from service.policy.traces import SPAN_HEADER

# The headers a copy sent back carries of its own (service/worker/reprocess.py): an edit cannot set or drop them.
RESERVED_HEADERS = frozenset(
    {
        SPAN_HEADER,
        "message-id",
        "failure-id",
        "origin-timestamp",
        "reprocess-run-id",
        "reprocess-edit-id",
        "reprocess-attempt",
        "consumer",
    }
)
STATES = ("pending_approval", "sent", "rejected")  # what an edit's `state` may be


class EditRefused(Exception):
    """An edit that is not made: the reason, in one line, names what to change."""


@dataclass(frozen=True)
class HeaderChanges:
    """What an edit does to the record's headers: values to set (replacing every header of that name, or adding
    one) and names to drop."""

    set: tuple[tuple[str, str], ...] = ()
    drop: tuple[str, ...] = ()

    def apply(self, headers: Headers) -> Headers:
        """The headers with these changes made, in their order (a new name at the end)."""
        for name in [*(name for name, _ in self.set), *self.drop]:
            if name.lower() in RESERVED_HEADERS:
                raise EditRefused(f"header {name!r} is the service's own on a copy sent back: it cannot be edited")
        dropped = set(self.drop)
        values = dict(self.set)
        changed: list[tuple[str, bytes]] = []
        placed: set[str] = set()
        for name, value in headers:
            if name in dropped or name in placed:
                continue
            if name in values:
                changed.append((name, values[name].encode()))
                placed.add(name)
            else:
                changed.append((name, value))
        changed += [(name, value.encode()) for name, value in self.set if name not in placed]
        return tuple(changed)


def parse_setting(given: str) -> tuple[str, str]:
    """`NAME=VALUE` as a header to set (EditRefused when there is no `=` or no name)."""
    name, equals, value = given.partition("=")
    if not equals or not name.strip():
        raise EditRefused(f"{given!r} is not NAME=VALUE")
    return name.strip(), value


@dataclass(frozen=True)
class Verdict:
    """Whether the domain takes the corrected payload: None when it does, else the code it would be quarantined
    under again, and the first failing field (path, rule) when the domain can say."""

    code: str | None
    field: tuple[str, str] | None = None

    @property
    def valid(self) -> bool:
        """The payload decodes as a message the handler takes."""
        return self.code is None

    def reason(self) -> str:
        """The verdict in words: `valid`, or the code and the failing field."""
        if self.code is None:
            return "valid"
        where = f" (field {self.field[0]}: {self.field[1]})" if self.field else ""
        return f"would be quarantined again as {self.code}{where}"


def judge(
    payload: bytes,
    decode: Callable[[bytes | None], Any],
    failing_field: Callable[[bytes | None], tuple[str, str] | None],
) -> Verdict:
    """The consumer's decoding of the corrected bytes (the domain's `decode`): a payload it would quarantine as
    INVALID_FIELD, MALFORMED_PAYLOAD or SCHEMA_UNSUPPORTED again is not valid."""
    decoded = decode(payload)
    if isinstance(decoded, DecodeFailure):
        return Verdict(decoded.code.value, failing_field(payload))
    return Verdict(None)


def pretty(payload: bytes | None) -> list[str]:
    """A payload as the diff shows it: indented JSON when it is JSON, else its text (or a line saying it is not)."""
    if payload is None:
        return ["(no payload)"]
    text = text_of(payload)
    if text is None:
        return [f"({len(payload)} bytes that are not text)"]
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False).splitlines()
    except ValueError:
        return text.splitlines()


def _shown(value: bytes) -> str:
    text = text_of(value)
    return json.dumps(text, ensure_ascii=False) if text is not None else f"({len(value)} bytes that are not text)"


def diff(payload_before: bytes | None, payload_after: bytes, headers_before: Headers, headers_after: Headers) -> str:
    """What an edit changes, as an auditor reads it: a unified diff of the pretty-printed payload, then one line
    per header added, changed or dropped (empty: it changes nothing)."""
    lines = list(
        difflib.unified_diff(
            pretty(payload_before), pretty(payload_after), "payload (original)", "payload (edited)", lineterm=""
        )
    )
    before, after = _by_name(headers_before), _by_name(headers_after)
    for name in [*before, *(name for name in after if name not in before)]:
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        if new is None:
            lines.append(f"header {name}: dropped (was {', '.join(map(_shown, old or ()))})")
        elif old is None:
            lines.append(f"header {name}: added {', '.join(map(_shown, new))}")
        else:
            lines.append(f"header {name}: {', '.join(map(_shown, old))} -> {', '.join(map(_shown, new))}")
    return "\n".join(lines)


def _by_name(headers: Sequence[tuple[str, bytes]]) -> dict[str, list[bytes]]:
    found: dict[str, list[bytes]] = {}
    for name, value in headers:
        found.setdefault(name, []).append(value)
    return found
