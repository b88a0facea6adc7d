#!/usr/bin/env bash
# n > 1 choices on chat and completions (the prompt prefilled once, sequences forked):
# tests/test_n_choices.py (the official `openai` client) against the default model, on a
# server with fewer slots than the largest n of the test (16), so that some sequences
# wait for a slot as ordinary requests.
set -u
Q="$1"
. "$(dirname "$0")/server_lib.sh"
start A --max-model-len 512 --max-num-seqs 6
rc=0
python3 tests/test_n_choices.py --url "http://127.0.0.1:$PORT_A" || rc=1
stop_servers || rc=1
exit $rc
