#!/usr/bin/env bash
# The prompt's logprobs on /v1/completions (echo with logprobs): tests/test_prompt_logprobs.py
# against the default model served in batch-invariant mode (a token's logprob is then the same
# number alone, batched, generated or echoed).
set -u
Q="$1"
. "$(dirname "$0")/server_lib.sh"
start A --max-model-len 1024 --max-num-seqs 4 --batch-invariant
rc=0
python3 tests/test_prompt_logprobs.py --url "http://127.0.0.1:$PORT_A" || rc=1
stop_servers || rc=1
exit $rc
