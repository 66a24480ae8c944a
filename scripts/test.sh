#!/usr/bin/env bash
# Installs everything (own .venv, pinned versions) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the drafter-forward oracle (tests/test_drafter.py): see requirements-oracle.txt
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-oracle.txt
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps speculators==0.9.0
# NeMo Automodel's EAGLE-3 cache writer (tests/test_states_real.py imports just its two cache modules)
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps nemo_automodel==0.7.0
exec .venv/bin/python -m pytest -q "$@"
