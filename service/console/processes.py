"""The console's view of the live system: the Processes page and `/api/processes`, read from the processes' heartbeats
(service/store/processes.py); the overview shows the same summary (service/console/pages.py)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.console.web import caller, reading, render
from service.jsonable import jsonable
from service.policy.heartbeat import GONE_AFTER_BEATS, RETENTION_SECONDS
from service.store import processes

_SHOWN = ("process_id", "role", "consumer_name", "host", "pid", "version", "interval_seconds", "started_at")


async def live_system(request: Request) -> dict[str, Any]:
    """Every process heard from within the retention, and the summary over the live ones."""
    async with reading(request) as connection:
        return await processes.system(connection)


def document(system: dict[str, Any]) -> dict[str, Any]:
    """The JSON document `/api/processes` answers and `status --json` prints (snake_case)."""
    shown: dict[str, Any] = jsonable(
        {
            "processes": [
                {
                    **{name: process[name] for name in _SHOWN},
                    "status": process["status"],
                    "last_seen": process["last_seen"],
                    "seconds_since_seen": process["seconds_since_seen"],
                    "stopped_at": process["stopped_at"],
                    **process["facts"],
                }
                for process in system["processes"]
            ],
            **{name: value for name, value in system.items() if name != "processes"},
        }
    )
    return shown


async def processes_page(request: Request) -> Response:
    """Every process with its partitions, lag, pauses, rates, breakers and configuration errors; silent ones gone."""
    caller(request)
    system = await live_system(request)
    return render(
        request,
        "processes.html",
        {**system, "gone_after": GONE_AFTER_BEATS, "retention_hours": RETENTION_SECONDS // 3600},
    )


async def api_processes(request: Request) -> Response:
    """What `status --json` prints."""
    caller(request)
    return JSONResponse(document(await live_system(request)))
