#!/usr/bin/env bash
# Installs everything (own .venv, pinned versions) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
