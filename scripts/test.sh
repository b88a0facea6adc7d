#!/usr/bin/env bash
# The test command: configure, build (CUDA sources too when nvcc is present; GPU
# tests skip without a GPU) and run every ctest test. The server tests drive
# `qdelta serve` with curl and the official `openai` and `anthropic` Python clients
# (and `jsonschema` to validate structured outputs); they are installed from PyPI here
# when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# the official clients the server tests drive: openai, anthropic; websocket-client for
# the chat page's headless-Chromium test (tests/cli_chat_page.sh)
for mod in openai:openai anthropic:anthropic websocket:websocket-client jsonschema:jsonschema; do
  if ! python3 -c "import ${mod%%:*}" 2>/dev/null; then
    python3 -m pip install -q "${mod#*:}" 2>/dev/null || python3 -m pip install -q --break-system-packages "${mod#*:}"
  fi
done
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)"
