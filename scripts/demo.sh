#!/usr/bin/env bash
# The main job: set-up (idempotent), the Sluice demo, then incident D replayed on this machine.
# Extra arguments go to `sluice demo`.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
bash scripts/bootstrap.sh
.venv/bin/sluice demo "$@"
exec .venv/bin/sluice incident run zombie-task --local
