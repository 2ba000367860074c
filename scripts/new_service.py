"""Render the template (copier.yml, template/) into a new project that depends on this checkout's core.

    python scripts/new_service.py TARGET --name NAME --domain PACKAGE [--env-prefix PREFIX_]
                                  [--metrics-prefix P] [--topic T]

TARGET must not exist, or be empty. The core is built as a wheel into TARGET/wheels/ (no package index serves
it here), and the project depends on it by name and version, as on a published one; its copier answers record
that, the template's source and commit, so `copier update` in TARGET brings later template changes. Bad input:
one line on stderr, exit 2. scripts/new-service runs this after scripts/bootstrap.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
PACKAGE = re.compile(r"^[a-z][a-z0-9_]*$")
PREFIX = re.compile(r"^[A-Z][A-Z0-9_]*_$")
WHEELS = "wheels"


def fail(message: str) -> NoReturn:
    """One line on stderr, exit 2."""
    print(f"new-service: {message}", file=sys.stderr)
    raise SystemExit(2)


def arguments(argv: list[str] | None) -> argparse.Namespace:
    """The command line, checked."""
    parser = argparse.ArgumentParser(prog="scripts/new-service", description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path, help="the new project's directory (absent or empty)")
    parser.add_argument("--name", required=True, help="the service: distribution, console script (shipments-service)")
    parser.add_argument("--domain", required=True, help="the domain's Python package (shipments)")
    parser.add_argument("--env-prefix", help="every variable's prefix (default: the package in capitals and _)")
    parser.add_argument("--metrics-prefix", help="every metric's prefix (default: the package)")
    parser.add_argument("--topic", help="the source topic (default: the package)")
    args = parser.parse_args(argv)
    if not NAME.fullmatch(args.name):
        fail(f"--name {args.name!r}: lower-case words joined by hyphens")
    if not PACKAGE.fullmatch(args.domain) or args.domain in ("service", "tests", "scripts"):
        fail(f"--domain {args.domain!r}: a lower-case Python identifier other than service, tests or scripts")
    if args.env_prefix is not None and not PREFIX.fullmatch(args.env_prefix):
        fail(f"--env-prefix {args.env_prefix!r}: upper-case, ending in _")
    if args.target.exists() and (not args.target.is_dir() or any(args.target.iterdir())):
        fail(f"{args.target} exists and is not an empty directory")
    return args


def core_requirement() -> tuple[str, str]:
    """This checkout's distribution and version, as a requirement (`name==version`), and its wheel's file name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name, version = project["name"], project["version"]
    return f"{name}=={version}", f"{name.replace('-', '_')}-{version}-py3-none-any.whl"


def build_wheel(into: Path, wheel: str) -> Path:
    """The core's wheel, built from this checkout into `into`."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "build", "--wheel", "--outdir", out, str(ROOT)]
        built = subprocess.run(command, capture_output=True, text=True, check=False)
        if built.returncode != 0:
            print(built.stdout[-3000:] + built.stderr[-3000:], file=sys.stderr)
            fail("building the core's wheel failed")
        into.mkdir(parents=True, exist_ok=True)
        target = into / wheel
        Path(out, wheel).replace(target)
    return target


def uncommitted() -> bool:
    """Whether this checkout has changes git has not committed."""
    status = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=False)
    return bool(status.stdout.strip())


def main(argv: list[str] | None = None) -> int:
    """Render the project, then put the core's wheel in it."""
    args = arguments(argv)
    if uncommitted():
        # copier renders them from a commit of its own, which the answers then record and this checkout never has.
        print(
            "new-service: this checkout has uncommitted changes: they are rendered, but `copier update` in the"
            " project needs a template commit this checkout has (commit first for a project you keep)",
            file=sys.stderr,
        )
    from copier import run_copy  # here: --help and bad input answer without loading it

    requirement, wheel = core_requirement()
    data = {
        "name": args.name,
        "domain": args.domain,
        "env_prefix": args.env_prefix or f"{args.domain.upper()}_",
        "metrics_prefix": args.metrics_prefix or args.domain,
        "topic": args.topic or args.domain,
        "core": requirement,
        "core_wheels": WHEELS,
        "core_checkout": str(ROOT),
    }
    # HEAD, with what is not committed yet: this checkout as it is, not its latest tag.
    run_copy(str(ROOT), str(args.target), data=data, defaults=True, vcs_ref="HEAD", quiet=True)
    build_wheel(args.target / WHEELS, wheel)
    files = [path for path in args.target.rglob("*") if path.is_file()]
    print(f"{args.target}: {args.name}, {len(files)} files, on {requirement} ({WHEELS}/{wheel})")
    print(f"next: cd {args.target} && git init && scripts/test")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
