#!/usr/bin/env bash
# The test suite: set-up (idempotent), lint, types, then pytest. Extra arguments go to pytest,
# e.g. `scripts/test.sh -m slow` for the slower fault runs or `scripts/test.sh tests/unit`.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
bash scripts/bootstrap.sh
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy
exec .venv/bin/pytest "$@"
