#!/usr/bin/env bash
# The chat page at / in headless Chromium (Debian's `chromium` package):
# tests/test_chat_page.py types a message, waits for the streamed reply, stops a second
# one, shows a reply's reasoning folded (the Qwen3.5 template, thinking on), and saves a screenshot to Testing/Temporary/chat_page.png in the build tree (the
# test log's folder). Skips (77) only when chromium is not installed.
set -u
Q="$1"
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROMIUM" ]; then
  echo "SKIP: chromium is not installed (apt-get install chromium)"
  exit 77
fi
. "$(dirname "$0")/server_lib.sh"
start A --chat-template tests/data/chat_template/qwen3_5.jinja --max-model-len 4096 --max-num-seqs 2
SHOT="$(cd "$(dirname "$Q")" && pwd)/Testing/Temporary/chat_page.png"
rc=0
python3 tests/test_chat_page.py --url "http://127.0.0.1:$PORT_A" --chromium "$CHROMIUM" --model qdelta-tiny --screenshot "$SHOT" || rc=1
stop_servers || rc=1
exit $rc
