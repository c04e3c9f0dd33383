#!/usr/bin/env bash
# The main job: set-up (idempotent), then the Sluice demo. Extra arguments go to `sluice demo`.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
bash scripts/bootstrap.sh
exec .venv/bin/sluice demo "$@"
