#!/usr/bin/env bash
# The Anthropic Messages API end to end: tests/test_anthropic.py (the official
# `anthropic` client: create, stream, thinking, tool-use round trip, count_tokens,
# errors) against two servers on free ports: the default model with an API key, and
# the default model with the Qwen3.5 chat template (tools, <think>).
set -u
Q="$1"
. "$(dirname "$0")/server_lib.sh"
start A --api-key anth-key-1 --max-model-len 512 --max-num-seqs 4
start B --chat-template tests/data/chat_template/qwen3_5.jinja --max-model-len 1024 --max-num-seqs 4
rc=0
python3 tests/test_anthropic.py --url "http://127.0.0.1:$PORT_A" --api-key anth-key-1 --tools-url "http://127.0.0.1:$PORT_B" || rc=1
python3 tests/test_anthropic_tools.py --url "http://127.0.0.1:$PORT_A" --api-key anth-key-1 --tools-url "http://127.0.0.1:$PORT_B" || rc=1
stop_servers || rc=1
exit $rc
