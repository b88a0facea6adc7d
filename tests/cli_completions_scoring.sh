#!/usr/bin/env bash
# What evaluation harnesses use on /v1/completions (the prompt's logprobs through echo, max_tokens 0,
# several prompts in one request): tests/test_completions_scoring.py against the default model
# served in batch-invariant mode (a request's tokens and logprobs are then the same numbers alone or
# batched).
set -u
Q="$1"
. "$(dirname "$0")/server_lib.sh"
start A --max-model-len 1024 --max-num-seqs 4 --batch-invariant
# B: one slot and a queue of two, for a batch that overflows the queue
start B --max-model-len 512 --max-num-seqs 1 --max-waiting 2
rc=0
python3 tests/test_completions_scoring.py --url "http://127.0.0.1:$PORT_A" --url-small "http://127.0.0.1:$PORT_B" || rc=1
stop_servers || rc=1
exit $rc
