#!/usr/bin/env bash
# The test command: configure, build (CUDA sources too when nvcc is present; GPU
# tests skip without a GPU) and run every ctest test. The server tests drive
# `qdelta serve` with curl and the official `openai` Python client (and `jsonschema`
# to validate structured outputs); both are installed from PyPI here when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import openai, jsonschema" 2>/dev/null; then
  python3 -m pip install -q openai jsonschema 2>/dev/null || python3 -m pip install -q --break-system-packages openai jsonschema
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)"
