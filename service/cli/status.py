"""`<program> status` (contract §3): the live system from the processes' heartbeats, as the console's Processes page
shows it."""

from __future__ import annotations

from typing import Any

import typer

from service.cli.common import JsonFlag, configured, print_json, run_async, show_rows, with_connection
from service.console.processes import document
from service.store import processes


def status(as_json: JsonFlag = False) -> None:
    """The processes from their heartbeats: role, host, partitions and lag, paused partitions, open breakers; a
    process silent for more than three heartbeat intervals is gone. Exit 0; 1 when the database cannot be read."""
    settings = configured()
    shown = document(run_async(lambda _: with_connection(settings, processes.system)))
    if as_json:
        print_json(shown)
        return
    rows = [_row(process) for process in shown["processes"]]
    lag = ", ".join(f"{topic} {count}" for topic, count in sorted(shown["lag_by_topic"].items())) or "-"
    oldest = shown["oldest_unprocessed_seconds"]
    more = f" ({shown['not_listed']} older not listed)" if shown["not_listed"] else ""
    age = "-" if oldest is None else f"{oldest:.0f}s"
    typer.echo(f"{shown['live']} live, {shown['gone']} gone{more}; lag: {lag}; oldest unprocessed: {age}")
    if not rows:
        typer.echo("no process has written a heartbeat")
        return
    show_rows(["status", "role", "host", "pid", "partitions (lag)", "paused", "open breakers", "errors"], rows)


def _row(process: dict[str, Any]) -> list[str]:
    partitions = process["partitions"]
    return [
        process["status"],
        process["role"],
        process["host"],
        str(process["pid"]),
        " ".join(f"{p['topic']}/{p['partition']}({'-' if p['lag'] is None else p['lag']})" for p in partitions) or "-",
        " ".join(f"{p['topic']}/{p['partition']}: {p['paused']}" for p in partitions if p["paused"]) or "-",
        " ".join(f"{b['downstream']}: {b['state']}" for b in process["breakers"] if b["state"] != "closed") or "-",
        "; ".join(process["config_errors"]) or "-",
    ]
