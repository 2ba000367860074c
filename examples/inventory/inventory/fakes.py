"""The inventory domain's fake stock and warehouse APIs, put on the core's generic fault-injection server.

Integration tests start `Warehouse` (in-process, or as a process with `python -m inventory.fakes`) and point the
domain at its URL. The routes' fault injection, latency and `/_control/*` come from the core's fault-injection
server (`service.ports.FaultServer`); this module only says what the two APIs answer and keep. Calls are counted by
the SKU for stock.get and by the idempotency key for holds.* and releases.*.

The warehouse is idempotent like a real one: a replayed key answers what its first call answered. A hold takes
its quantity from the stock it shows; one larger than what is there is refused (422); a release gives it back,
and a release of a key that holds nothing answers 404.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Final

from service.ports import (
    FakeApi,
    FaultServer,
    Reply,
    Request,
    Route,
    json_field,
    json_reply,
    key_from_header,
    key_from_param,
    key_from_query,
    serve_from_command_line,
)

STOCK_GET: Final = "stock.get"
HOLDS_POST: Final = "holds.post"
HOLDS_GET: Final = "holds.get"
RELEASES_POST: Final = "releases.post"
RELEASES_GET: Final = "releases.get"
ROUTES: Final = (STOCK_GET, HOLDS_POST, HOLDS_GET, RELEASES_POST, RELEASES_GET)


def _hold_problem(payload: dict[str, Any]) -> str | None:
    """What is wrong with a hold body, or None when it is valid."""
    for name in ("reservation_id", "sku", "warehouse"):
        if not isinstance(payload.get(name), str) or not payload[name]:
            return f"{name} must be a non-empty string"
    quantity = payload.get("quantity")
    if isinstance(quantity, bool) or not isinstance(quantity, int) or quantity <= 0:
        return "quantity must be a positive integer"
    return None


class InventoryFakes:
    """What the fake stock and warehouse APIs keep, and how they answer; mount `api()` on a server."""

    def __init__(self) -> None:
        """Start with no stock, holds or releases."""
        # One lock for all state: handlers run on many threads and every operation is tiny.
        self._lock = threading.Lock()
        self._stock: dict[str, dict[str, int]] = {}
        self._holds: dict[str, dict[str, Any]] = {}
        self._releases: dict[str, dict[str, Any]] = {}
        # Every hold and release in arrival order, so tests can check which came first.
        self._journal: list[tuple[str, str]] = []
        # Id sequences survive reset() so an id seen before a reset can never name a different record after.
        self._seq = 0

    def api(self) -> FakeApi:
        """The routes, controls, state and reset the fault-injection server serves for these APIs."""
        return FakeApi(
            routes=(
                Route(STOCK_GET, "GET", "/stock/{sku}", self._get_stock, key_from_param("sku")),
                Route(HOLDS_POST, "POST", "/holds", self._post_hold, key_from_header("Idempotency-Key")),
                Route(HOLDS_GET, "GET", "/holds", self._get_hold, key_from_query("idempotency_key")),
                Route(RELEASES_POST, "POST", "/releases", self._post_release, key_from_header("Idempotency-Key")),
                Route(RELEASES_GET, "GET", "/releases", self._get_release, key_from_query("idempotency_key")),
            ),
            controls={"stock": self._control_stock},
            snapshot=self.snapshot,
            reset=self.reset,
        )

    def set_stock(self, sku: str, warehouse: str, available: int) -> None:
        """Make the catalogue know `sku`, with `available` of it at `warehouse`."""
        if isinstance(available, bool) or not isinstance(available, int) or available < 0:
            raise ValueError(f"available must be a non-negative integer, got {available!r}")
        with self._lock:
            self._stock.setdefault(sku, {})[warehouse] = available

    def reset(self) -> None:
        """Forget stock, holds and releases."""
        with self._lock:
            self._stock.clear()
            self._holds.clear()
            self._releases.clear()
            self._journal.clear()

    def stock(self, sku: str) -> dict[str, int]:
        """What each warehouse has of `sku` now ({} for a SKU the catalogue does not know)."""
        with self._lock:
            return dict(self._stock.get(sku, {}))

    def holds(self) -> dict[str, dict[str, Any]]:
        """Snapshot of the holds by idempotency key."""
        with self._lock:
            return copy.deepcopy(self._holds)

    def releases(self) -> dict[str, dict[str, Any]]:
        """Snapshot of the releases by idempotency key."""
        with self._lock:
            return copy.deepcopy(self._releases)

    def journal(self) -> list[tuple[str, str]]:
        """Every hold and release the warehouse made, in order: ("hold" | "release", idempotency key)."""
        with self._lock:
            return list(self._journal)

    def snapshot(self) -> Mapping[str, object]:
        """The stock, holds and releases, as `GET /_control/state` shows them."""
        with self._lock:
            return {
                "stock": copy.deepcopy(self._stock),
                "holds": copy.deepcopy(self._holds),
                "releases": copy.deepcopy(self._releases),
            }

    def _get_stock(self, request: Request) -> Reply:
        """GET /stock/{sku}."""
        sku = request.params["sku"]
        with self._lock:
            levels = self._stock.get(sku)
            found = None if levels is None else dict(levels)
        if found is None:
            return json_reply(404, {"error": "unknown sku"})
        return json_reply(200, {"sku": sku, "warehouses": found})

    def _post_hold(self, request: Request) -> Reply:
        """POST /holds: idempotent on the Idempotency-Key header; takes the quantity from the stock."""
        key, payload = request.header("Idempotency-Key"), request.payload
        if not key:
            return json_reply(400, {"error": "missing Idempotency-Key header"})
        if payload is None:
            return json_reply(400, {"error": "body must be a JSON object"})
        problem = _hold_problem(payload)
        if problem is not None:
            return json_reply(400, {"error": problem})
        with self._lock:
            stored = self._holds.get(key)
            if stored is not None:
                return json_reply(200, {"hold_id": stored["hold_id"], "status": "held"})
            levels = self._stock.get(payload["sku"], {})
            if levels.get(payload["warehouse"], 0) < payload["quantity"]:
                return json_reply(422, {"error": "insufficient_stock"})
            levels[payload["warehouse"]] -= payload["quantity"]
            self._seq += 1
            hold = {
                "hold_id": f"hold_{self._seq}",
                "reservation_id": payload["reservation_id"],
                "sku": payload["sku"],
                "quantity": payload["quantity"],
                "warehouse": payload["warehouse"],
                "idempotency_key": key,
                "released": False,
            }
            self._holds[key] = hold
            self._journal.append(("hold", key))
        return json_reply(201, {"hold_id": hold["hold_id"], "status": "held"})

    def _post_release(self, request: Request) -> Reply:
        """POST /releases: idempotent on the Idempotency-Key header; gives the hold `hold_key` back."""
        key, payload = request.header("Idempotency-Key"), request.payload
        if not key:
            return json_reply(400, {"error": "missing Idempotency-Key header"})
        hold_key = None if payload is None else payload.get("hold_key")
        if not isinstance(hold_key, str):
            return json_reply(400, {"error": "hold_key must be a string"})
        with self._lock:
            stored = self._releases.get(key)
            if stored is not None:
                return json_reply(200, {"release_id": stored["release_id"]})
            hold = self._holds.get(hold_key)
            if hold is None or hold["released"]:
                return json_reply(404, {"error": "no such hold"})
            hold["released"] = True
            levels = self._stock.setdefault(hold["sku"], {})
            levels[hold["warehouse"]] = levels.get(hold["warehouse"], 0) + hold["quantity"]
            self._seq += 1
            release = {"release_id": f"release_{self._seq}", "hold_key": hold_key, "idempotency_key": key}
            self._releases[key] = release
            self._journal.append(("release", key))
        return json_reply(201, {"release_id": release["release_id"]})

    def _get_hold(self, request: Request) -> Reply:
        """GET /holds?idempotency_key=K."""
        return self._find(self._holds, request)

    def _get_release(self, request: Request) -> Reply:
        """GET /releases?idempotency_key=K."""
        return self._find(self._releases, request)

    def _find(self, records: dict[str, dict[str, Any]], request: Request) -> Reply:
        """One record by the `idempotency_key` query parameter: 200, or 404."""
        key = request.query.get("idempotency_key")
        if key is None:
            return json_reply(400, {"error": "missing idempotency_key query parameter"})
        with self._lock:
            stored = records.get(key)
            found = None if stored is None else dict(stored)
        if found is None:
            return json_reply(404, {"error": "not found"})
        return json_reply(200, found)

    def _control_stock(self, payload: dict[str, Any]) -> None:
        """`POST /_control/stock` with `{"sku": ..., "warehouse": ..., "available": n}`."""
        self.set_stock(
            json_field(payload, "sku", str),
            json_field(payload, "warehouse", str),
            json_field(payload, "available", int),
        )


class Warehouse(FaultServer):
    """The fake stock and warehouse APIs alone on a fault-injection server, as the inventory tests use them."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Configure the address; nothing listens until start()."""
        self.fakes = InventoryFakes()
        super().__init__(host, port, apis=(self.fakes.api(),))


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the fake APIs until SIGTERM or SIGINT, after printing the base URL as the only stdout line."""
    return serve_from_command_line(
        Warehouse,
        prog="python -m inventory.fakes",
        description="Fake stock and warehouse APIs with fault injection (see /_control/*).",
        argv=argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
