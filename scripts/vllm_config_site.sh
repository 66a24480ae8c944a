#!/usr/bin/env bash
# Install vLLM 0.33.0 (no dependencies) and the pure-Python packages its config classes import
# into DIR, for tests/test_capture_vllm.py::test_vllm_own_classes_accept_the_invocation on a
# machine without a GPU (vLLM's engine itself cannot start there: docs/capture-at-scale.md).
# Nothing is installed into the project's environment; torch, transformers, pydantic come from it.
#   bash scripts/vllm_config_site.sh /tmp/vllm-site
#   EAGLE3CONV_VLLM_SITE=/tmp/vllm-site python -m pytest tests/test_capture_vllm.py
set -euo pipefail
DIR=${1:?usage: scripts/vllm_config_site.sh DIR}
PY=${PYTHON:-python}
"$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$DIR" \
  vllm==0.33.0 \
  aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 apache-tvm-ffi==0.1.15.post2 attrs==26.1.0 \
  cachetools==8.0.2 cbor2==6.3.0 cloudpickle==3.1.3 fastapi==0.165.0 frozenlist==1.8.0 llguidance==1.9.1 \
  msgspec==0.23.0 multidict==7.2.1 openai-harmony==0.0.8 opentelemetry-api==1.45.2 \
  partial-json-parser==0.2.1.1.post7 pillow==13.0.0 prometheus-client==0.26.0 propcache==0.5.4 \
  py-cpuinfo==9.0.0 pybase64==1.5.1 pyzmq==27.3.0 starlette==1.10.0 uvloop==0.23.0 xgrammar==0.2.9 \
  yarl==1.25.1
echo "vLLM 0.33.0's config classes importable from $DIR (set EAGLE3CONV_VLLM_SITE=$DIR)"
