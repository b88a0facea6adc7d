#!/usr/bin/env bash
# The test command: configure, build (CUDA sources too when nvcc is present; GPU
# tests skip without a GPU) and run every ctest test.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)"
