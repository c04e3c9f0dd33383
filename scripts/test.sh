#!/usr/bin/env bash
# The test suite: set-up (idempotent), lint, types, then pytest. Extra arguments go to pytest,
# e.g. `scripts/test.sh -m slow` for the slower fault runs or `scripts/test.sh tests/unit`.
#
# Tests run on SLUICE_TEST_WORKERS pytest-xdist workers side by side (default 3; 0 runs them in
# this process): most of the suite waits on brokers, timeouts and sessions, not on the CPU
# (a serial run keeps one of the two cores busy on average). The longest tests, which start
# Spark worker processes, are in three groups of about equal length (xdist_group workers-1..3);
# xdist hands out the groups first (it orders work by its number of tests), so each worker
# begins with one chain and the short tests fill in around them.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
bash scripts/bootstrap.sh
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy
exec .venv/bin/pytest -n "${SLUICE_TEST_WORKERS:-3}" --dist loadgroup --durations=30 "$@"
