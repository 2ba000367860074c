"""The lock files pin every dependency that pyproject.toml names, with hashes, and agree with each other."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def pins(name: str) -> dict[str, str]:
    """`requirements/<name>.txt` as {canonical name: version}; every pin must carry at least one hash."""
    text = (ROOT / "requirements" / name).read_text()
    found: dict[str, str] = {}
    for block in re.split(r"\n(?=\S)", text):
        match = re.match(r"([A-Za-z0-9._-]+)==(\S+)", block)
        if match:
            assert "--hash=sha256:" in block, f"{name}: {match.group(1)} has no hash"
            found[canonicalize_name(match.group(1))] = match.group(2)
    return found


def declared(*extras: str) -> set[str]:
    """The names of pyproject.toml's runtime dependencies and of the named extras'."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in extras:
        specs += project["optional-dependencies"][extra]
    return {canonicalize_name(Requirement(spec).name) for spec in specs}


def test_the_runtime_lock_pins_every_runtime_dependency() -> None:
    assert declared() <= set(pins("runtime.txt")), declared() - set(pins("runtime.txt"))


def test_the_dev_lock_pins_every_dependency_of_every_extra() -> None:
    wanted = declared("dev", "bench")
    assert wanted <= set(pins("dev.txt")), wanted - set(pins("dev.txt"))


def test_the_runtime_pins_are_the_dev_pins_so_the_image_runs_what_the_tests_ran() -> None:
    runtime, dev = pins("runtime.txt"), pins("dev.txt")
    differ = {name: (version, dev.get(name)) for name, version in runtime.items() if dev.get(name) != version}
    assert not differ, differ


def test_the_pinned_versions_satisfy_the_ranges_of_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dev = pins("dev.txt")
    specs = [Requirement(spec) for spec in [*project["dependencies"], *project["optional-dependencies"]["dev"]]]
    outside = [str(spec) for spec in specs if not spec.specifier.contains(dev[canonicalize_name(spec.name)])]
    assert not outside, outside
