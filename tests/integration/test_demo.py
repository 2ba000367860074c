"""`scripts/demo` runs the whole pipeline and its printed counts match what it produced."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import urllib.request

import pytest

from tests.support import ROOT, Topics, delete_topics


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
def test_the_demo_exits_0_with_every_count_as_expected_and_leaves_a_console_to_log_in_to(kafka: str) -> None:
    port = _free_port()
    result = subprocess.run(
        [str(ROOT / "scripts" / "demo")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "DEMO_CONSOLE_PORT": str(port)},
    )
    pid_file = ROOT / ".local" / "demo" / "console.pid"
    try:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "MISMATCH" not in result.stdout
        assert "every record reached a terminal state, each exactly once" in result.stdout
        assert "│ records produced" in result.stdout

        # The console it printed answers with the printed token, on the demo's data.
        printed = re.search(r"Operator console: (http://127\.0\.0\.1:\d+/)  token: (\S+)", result.stdout)
        assert printed, result.stdout[-2000:] + result.stderr[-2000:]
        url, token = printed.groups()
        assert url == f"http://127.0.0.1:{port}/"
        request = urllib.request.Request(f"{url}api/stats", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            stats = json.loads(response.read())
        assert stats["open"] > 0  # the demo quarantines records on purpose
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
            pid_file.unlink()
        # A user's demo keeps its topics for the console it leaves; the suite's leaves none (tests/conftest.py).
        consumed = re.search(r"is consuming (orders-demo-\d+)", result.stdout)
        if consumed:
            asyncio.run(delete_topics(kafka, Topics(consumed.group(1))))
