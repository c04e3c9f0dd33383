#!/usr/bin/env bash
# The test suite: set-up (idempotent), lint, types, the user guide's site, then pytest. Extra
# arguments go to pytest, e.g. `scripts/test.sh -m slow` for the slower fault runs or
# `scripts/test.sh tests/unit`.
#
# Tests run on SLUICE_TEST_WORKERS pytest-xdist workers side by side (default 3; 0 runs them in
# this process): most of the suite waits on brokers, timeouts and sessions, not on the CPU
# (a serial run keeps one of the two cores busy on average). The longest tests, which start
# Spark worker processes, run in two chains (tests/conftest.py CHAINS), handed out first.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
bash scripts/bootstrap.sh
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy
.venv/bin/lint-imports  # the layer contract of pyproject.toml [tool.importlinter]
# The user guide as a site, into a temporary directory: a broken link or anchor fails here.
site="$(mktemp -d)"
.venv/bin/mkdocs build --strict --quiet --site-dir "$site"
rm -rf "$site"
exec .venv/bin/pytest -n "${SLUICE_TEST_WORKERS:-3}" --dist loadscope --durations=30 "$@"
