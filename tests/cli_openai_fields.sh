#!/usr/bin/env bash
# The OpenAI request fields logit_bias, min_tokens, stop_token_ids, content parts, the
# history's tool calls and the refusal of image / audio / file content parts:
# tests/test_openai_fields.py (the official `openai` client, raw HTTP for the errors)
# against the default model, with its own chat template and with Qwen3.5's.
set -u
Q="$1"
. "$(dirname "$0")/server_lib.sh"
start A --max-model-len 512 --max-num-seqs 4
# B: the same model with Qwen3.5's chat template (tool calls and content parts as it renders them)
start B --max-model-len 1024 --max-num-seqs 2 --chat-template tests/data/chat_template/qwen3_5.jinja
rc=0
python3 tests/test_openai_fields.py --url "http://127.0.0.1:$PORT_A" --url35 "http://127.0.0.1:$PORT_B" || rc=1
stop_servers || rc=1
exit $rc
