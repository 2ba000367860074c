"""`scripts/demo` runs the whole pipeline and its printed counts match what it produced."""

from __future__ import annotations

import subprocess

import pytest

from tests.support import ROOT


@pytest.mark.slow
def test_the_demo_exits_0_with_every_count_as_expected(kafka: str) -> None:
    result = subprocess.run(
        [str(ROOT / "scripts" / "demo")], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "MISMATCH" not in result.stdout
    assert "every record reached a terminal state, each exactly once" in result.stdout
    assert "│ records produced" in result.stdout
