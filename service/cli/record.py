"""How `<program> quarantine show` prints one record for a person: labelled sections, every value escaped."""

from __future__ import annotations

from typing import Any

from service import inert
from service.cli import layout
from service.cli.layout import tables
from service.jsonable import jsonable
from service.moments import utc


def print_record(row: dict[str, Any]) -> None:
    """A record as labelled sections: facts, source headers, envelope, payload (when revealed), notes, reprocess
    attempts and the timeline; every value escaped, every timestamp in UTC with `Z`."""
    console = tables()
    failing = row.get("failing_field")
    resolved = [
        ("resolution", row["resolution"]),
        ("resolved by", row["resolved_by"]),
        ("resolved at", row["resolved_at"]),
    ]
    erased = [("erasure", _erasure(row))] if row.get("erased_at") is not None else []
    layout.section(
        console,
        "facts",
        layout.facts(
            [
                ("failure id", row["failure_id"]),
                ("consumer", row["consumer_name"]),
                ("message id", row["message_id"]),
                ("ordering key", row["ordering_key"]),
                ("error code", row["error_code"]),
                *([("failing field", f"{failing['path']}: {failing['rule']}")] if failing else []),
                ("owner", row["owner"]),
                ("status", row["status"]),
                *(resolved if row["resolution"] else []),
                *erased,
                ("attempts", row["attempts"]),
                ("repeat failures", row["repeat_failures"]),
                ("first failed", row["first_failed_at"]),
                ("last failed", row["last_failed_at"]),
            ]
        ),
    )
    layout.section(console, "source headers", layout.headers(row["source_headers"]))
    layout.section(console, "envelope", layout.document(row["envelope"]))
    if "payload" in row:
        layout.section(console, "payload (base64)", [layout.value_of(jsonable(row["payload"]))])
    if "payload_text" in row:
        text = row["payload_text"]
        lines = text.split("\n") if text is not None else ["(not UTF-8 text: see --include-payload)"]
        layout.section(console, "payload (text)", [inert.shown(line) for line in lines])
    layout.section(
        console,
        "notes",
        [
            f"{utc(note['created_at'])}  {inert.shown(note['author'])}: {inert.shown(note['note'])}"
            for note in row["annotations"]
        ],
    )
    layout.section(
        console,
        "reprocessing",
        [
            f"run {inert.shown(item['run_id'])} attempt {item['attempt']}: {item['outcome']}"
            f" (published {utc(item['published_at'])}, settled {utc(item['verified_at'])})"
            for item in row["reprocessing"]
        ],
    )
    layout.section(
        console,
        "timeline (UTC, in the order it happened)",
        [f"{utc(event['at'])}  {inert.shown(happened(event))}" for event in row["timeline"]],
    )


def _erasure(row: dict[str, Any]) -> str:
    """When and by whom a record's payload and header values were erased."""
    return f"erased at {utc(row['erased_at'])} by {row.get('erased_by')}: its payload and header values are gone"


def happened(event: dict[str, Any]) -> str:
    """One timeline event in words: `failed (attempt 3, DOWNSTREAM_5XX)`, `resolved by eve: dropped`."""
    facts = [f"attempt {event['attempts']}"] if event.get("attempts") else []
    if event.get("error_code"):
        facts.append(event["error_code"])
    said = str(event["event"]) + (f" ({', '.join(facts)})" if facts else "")
    if event.get("actor"):
        said += f" by {event['actor']}"
    if event.get("detail"):
        said += f": {event['detail']}"
    return said
