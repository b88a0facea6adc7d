#!/usr/bin/env bash
# The OpenAI request fields logit_bias, min_tokens, stop_token_ids and the refusal of
# image / audio / file content parts: tests/test_openai_fields.py (the official
# `openai` client, raw HTTP for the errors) against the default model.
set -u
Q="$1"
. "$(dirname "$0")/server_lib.sh"
start A --max-model-len 512 --max-num-seqs 4
rc=0
python3 tests/test_openai_fields.py --url "http://127.0.0.1:$PORT_A" || rc=1
stop_servers || rc=1
exit $rc
