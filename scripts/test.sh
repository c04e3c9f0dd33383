#!/usr/bin/env bash
# The test suite: set-up (idempotent), lint, types, then pytest. Extra arguments go to pytest,
# e.g. `scripts/test.sh -m slow` for the slower fault runs or `scripts/test.sh tests/unit`.
#
# Tests run on SLUICE_TEST_WORKERS pytest-xdist workers side by side (default 2; 0 runs them in
# this process): most of the suite waits on brokers, timeouts and sessions rather than on the
# CPU. Tests that start `sluice worker` processes with Spark share the group "workers" and run
# one after another on one worker, so at most one of them loads the machine at a time.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
bash scripts/bootstrap.sh
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy
exec .venv/bin/pytest -n "${SLUICE_TEST_WORKERS:-2}" --dist loadgroup --durations=30 "$@"
