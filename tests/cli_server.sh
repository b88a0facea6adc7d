#!/usr/bin/env bash
# qdelta serve end to end over loopback: curl checks of every route and error, then
# tests/test_server.py (the official openai client: streaming, stop strings, seeds,
# usage, tools, errors, disconnects, 64 concurrent streams, batch invariance, soak),
# then graceful shutdown with a stream open (SIGTERM -> exit 0; under ASan that also
# means no leaks). Servers listen on port 0 (any free port) and print it.
#
# Under ASan + UBSan (the CI sanitizer stage runs it through ctest in build-asan):
#   CC=clang cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQD_SANITIZE=ON -DQD_CUDA=OFF
#   cmake --build build-asan -j --target qdelta
#   ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 bash tests/cli_server.sh build-asan/qdelta
# An ASan binary is detected below: the soak shrinks and its RSS check is skipped (ASan's
# quarantine holds freed memory); leaks show as a nonzero server exit after SIGTERM.
# QD_SERVER_SOAK=N overrides the soak's request count.
set -u
Q="$1"
pass=0 fail=0
. "$(dirname "$0")/server_lib.sh" # T, start NAME ARGS..., stop_servers, ok / bad / check

# An ASan build is slower and its allocator quarantine grows RSS: smaller soak, no RSS check.
ASAN=0
if grep -q "AddressSanitizer" "$Q" 2>/dev/null; then ASAN=1; fi
SOAK=${QD_SERVER_SOAK:-$([ $ASAN = 1 ] && echo 300 || echo 3000)}

KEY=test-key-123
printf '%s\n' "$KEY" > "$T/api.key"   # the key from a file (--api-key-file), trailing newline dropped
# A, F and G run with the prefix cache off (on by default) as their checks assume: the
# soak's RSS bound, queue and invariance counts without snapshots
start A --api-key-file "$T/api.key" --max-model-len 512 --max-num-seqs 16 --no-prefix-cache
# B also bounds its steps (--max-step-ms: every check on B runs under the bound)
start B --chat-template tests/data/chat_template/qwen3_5.jinja --max-model-len 1024 --max-num-seqs 4 \
  --prefix-cache-memory 67108864 --max-step-ms 1
A="http://127.0.0.1:$PORT_A"
B="http://127.0.0.1:$PORT_B"
C=(curl -s -m 60 -H "Authorization: Bearer $KEY")

# ------------------------------------------------------------ curl: routes and errors
code() { "${C[@]}" -o "$T/body" -w '%{http_code}' "$@"; }
check "[ \$(code $A/health) = 200 ]" "/health 200"
check "[ \$(code $A/v1/models) = 200 ] && grep -q '\"object\":\"list\"' $T/body" "/v1/models"
check "[ \$(curl -s -m 10 -o /dev/null -w '%{http_code}' $A/v1/models) = 401 ]" "no key -> 401"
check "[ \$(curl -s -m 10 -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer nope' $A/v1/models) = 401 ]" "wrong key -> 401"
check "[ \$(code $A/v1/unknown) = 404 ]" "unknown route -> 404"
check "[ \$(curl -s -m 10 -o /dev/null -w '%{http_code}' -d '{\"prompt\":\"hi\"}' $A/tokenize) = 401 ]" "/tokenize without the key -> 401"
check "[ \$(code -d '{\"prompt\":\"hi\"}' $A/tokenize) = 200 ] && grep -q '\"count\":' $T/body" "/tokenize with the key"
check "[ \$(curl -s -m 10 -o /dev/null -w '%{http_code}' $A/tokenizer_info) = 401 ] && [ \$(code $A/tokenizer_info) = 200 ]" "/tokenizer_info behind the key"
check "[ \$(code -X DELETE $A/v1/models) = 405 ]" "wrong method -> 405"
check "[ \$(code -d '{bad json' $A/v1/chat/completions) = 400 ] && grep -q '\"type\":\"invalid_request_error\"' $T/body" "malformed JSON -> 400 OpenAI shape"
check "[ \$(code -d '{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":\"5\"}' $A/v1/chat/completions) = 400 ] && grep -q '\"param\":\"max_tokens\"' $T/body" "wrong type -> 400 naming the field"
check "[ \$(code -d '{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":-1}' $A/v1/chat/completions) = 400 ]" "negative max_tokens -> 400"
check "[ \$(code -d '{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":99999999}' $A/v1/chat/completions) = 400 ] && grep -q 'maximum context length' $T/body" "huge max_tokens -> 400"
head -c 5000000 /dev/zero | tr '\0' a >"$T/big"
check "[ \$(code --data-binary @$T/big $A/v1/completions) = 413 ]" "4 MiB+ body -> 413"
check "[ \$(code -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":6,\"temperature\":0,\"whatever\":{\"x\":1}}' $A/v1/chat/completions) = 200 ] && grep -q '\"object\":\"chat.completion\"' $T/body && grep -q '\"completion_tokens\":' $T/body" "chat non-stream (unknown field ignored)"
"${C[@]}" -N -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":6,"temperature":0,"stream":true}' $A/v1/chat/completions >"$T/sse"
check "grep -q '^data: {.*chat.completion.chunk' $T/sse && [ \"\$(grep -v '^\$' $T/sse | tail -n 1)\" = 'data: [DONE]' ]" "chat stream ends with data: [DONE]"
check "grep -q '\"finish_reason\":\"length\"' $T/sse" "chat stream finish_reason"
check "[ \$(code -d '{\"prompt\":[10,20,30],\"max_tokens\":3,\"temperature\":0}' $A/v1/completions) = 200 ] && grep -q '\"prompt_tokens\":3' $T/body" "completions with token ids"
check "[ \$(code -d '{\"prompt\":[10,20,30],\"max_tokens\":3,\"temperature\":0,\"logprobs\":0,\"ignore_eos\":true,\"return_tokens_as_token_ids\":true}' $A/v1/completions) = 200 ] && [ \$(grep -o '\"token_id:[0-9]*\"' $T/body | wc -l) = 3 ]" "return_tokens_as_token_ids: logprobs name tokens by id"
check "curl -s -m 10 $A/metrics | grep -q '^qdelta_time_to_first_token_seconds_bucket'" "/metrics Prometheus text"
check "curl -s -m 10 $B/metrics | grep -q '^qdelta_engine_step_cost_ms{term=\"per_prompt_token\"} ' && curl -s -m 10 $B/metrics | grep -q '^qdelta_engine_bounded_steps_total '" "/metrics: the step cost model and the bounded steps"
check "! '$Q' serve --max-step-ms -5 >/dev/null 2>$T/err && grep -q -- '--max-step-ms' $T/err" "serve rejects a negative --max-step-ms"
# prefix cache (on in B): the same prompt twice, the second hits; identical greedy text
for i in 1 2; do
  curl -s -m 60 -o "$T/pc.$i" -d '{"prompt":[11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30],"max_tokens":5,"temperature":0}' $B/v1/completions
done
check "grep -q '\"text\"' $T/pc.1 && [ \"\$(grep -o '\"text\":\"[^\"]*\"' $T/pc.1)\" = \"\$(grep -o '\"text\":\"[^\"]*\"' $T/pc.2)\" ]" "prefix cache: same text on a hit"
check "curl -s -m 10 $B/metrics | grep -q '^qdelta_prefix_cache_hit_tokens_total [1-9]'" "prefix cache: /metrics counts hits"
check "curl -s -m 10 $B/metrics | grep -q '^qdelta_prefix_cache_snapshots [1-9]'" "prefix cache: /metrics counts snapshots"
# a chat's second turn hits the first turn's history: the template renders the first reply
# without the <think> opener its generation prompt had, so only the snapshot the server asks
# for at the end of the history (before the generation prompt) lies on the shared path
pc_hits() { curl -s -m 10 $B/metrics | sed -n 's/^qdelta_prefix_cache_hit_tokens_total //p'; }
SYS='{"role":"system","content":"You are a terse assistant. Answer every question with one short word."}'
h0=$(pc_hits)
curl -s -m 60 -o "$T/turn1" -d "{\"messages\":[$SYS,{\"role\":\"user\",\"content\":\"Name a colour.\"}],\"max_tokens\":4,\"temperature\":0}" $B/v1/chat/completions
h1=$(pc_hits)
curl -s -m 60 -o "$T/turn2" -d "{\"messages\":[$SYS,{\"role\":\"user\",\"content\":\"Name a colour.\"},{\"role\":\"assistant\",\"content\":\"Blue.\"},{\"role\":\"user\",\"content\":\"Name a fruit.\"}],\"max_tokens\":4,\"temperature\":0}" $B/v1/chat/completions
h2=$(pc_hits)
check "grep -q 'chat.completion' $T/turn2 && [ \"\${h0%.*}\" = \"\${h1%.*}\" ] && [ \$(( \${h2%.*} - \${h1%.*} )) -ge 20 ]" "prefix cache: a chat's second turn hits the first turn's history ($h0 -> $h1 -> $h2)"

# queue full: one running sequence and one waiting place, eight long requests at once
start F --max-num-seqs 1 --max-waiting 1 --no-prefix-cache
CURLS=()
for i in 1 2 3 4 5 6 7 8; do
  curl -s -m 120 -o /dev/null -w '%{http_code}\n' -d '{"prompt":"Once","max_tokens":300,"ignore_eos":true}' \
    "http://127.0.0.1:$PORT_F/v1/completions" >"$T/full.$i" &
  CURLS+=($!)
done
wait "${CURLS[@]}"
check "cat $T/full.* | grep -q 503 && cat $T/full.* | grep -q 200" "queue full -> 503 (codes: $(cat $T/full.* | sort | uniq -c | tr '\n' ' '))"
kill -TERM "$PID_F"
rcF=0; wait "$PID_F" || rcF=$?
check "[ $rcF = 0 ]" "server F exits 0 on SIGTERM"

# batch-invariant mode: 16 concurrent greedy requests (prompts up to 300 tokens, cut into
# 64-aligned pieces under a 128-token step budget) return exactly their solo tokens, through
# the forward's argmax and (not under ASan, for time) through the sampler (bench/invariance.py
# compares id for id)
start G --batch-invariant --max-batch-tokens 128 --max-model-len 1024 --max-num-seqs 16 --no-prefix-cache
for tl in 0 $([ $ASAN = 1 ] || echo 2); do
  if python3 bench/invariance.py --url "http://127.0.0.1:$PORT_G" --requests 16 --prompt-len 1..300 --max-tokens 4..16 \
       --top-logprobs $tl --label "tiny, batch-invariant" >"$T/inv.$tl" 2>&1 && grep -q "ok=1" "$T/inv.$tl"; then ok
  else bad "batch-invariant server: $(tail -n 3 "$T/inv.$tl" | tr '\n' ' ')"; fi
done
kill -TERM "$PID_G"
rcG=0; wait "$PID_G" || rcG=$?
check "[ $rcG = 0 ]" "server G exits 0 on SIGTERM"

# ------------------------------------------------------------ defaults, banner, help
# the banner: printed once when ready, naming the URL, the model, the backend, the memory
# plan and the prefix cache
check "[ \$(grep -c 'ready on http://127.0.0.1:$PORT_A\$' $T/A.err) = 1 ] && grep -q '^  model      \"qdelta-tiny\" (qwen3_next, ' $T/A.err && grep -q '^  backend    cpu, [0-9]* threads, API key required' $T/A.err && grep -q '^  memory     weights .*, GDN state .* (16 seqs), KV cache .* (512 tokens each)' $T/A.err && grep -q '^  prefix cache off' $T/A.err" "banner of A ($(cat "$T/A.err"))"
check "grep -q '^  prefix cache on, 64.0 MiB\$' $T/B.err" "banner of B: the prefix cache budget given ($(grep 'prefix cache' "$T/B.err"))"
# the prefix cache is on by default, with a budget from the memory left, and it hits
start H --max-model-len 512 --max-num-seqs 2
H="http://127.0.0.1:$PORT_H"
check "grep -q '^  prefix cache on, .* (from the memory left; --no-prefix-cache turns it off)' $T/H.err" "default: prefix cache on ($(grep 'prefix cache' "$T/H.err"))"
for k in 1 2; do curl -s -m 60 -d '{"prompt":"The quick brown fox jumps over the lazy dog, and then","max_tokens":2,"temperature":0}' $H/v1/completions >/dev/null; done
check "curl -s -m 10 $H/metrics | grep -q '^qdelta_prefix_cache_hit_tokens_total [1-9]'" "default: the second identical prompt hits the prefix cache"
# roles: only the OpenAI API's; any other is a 400 naming it
check "[ \$(curl -s -m 30 -o $T/body -w '%{http_code}' -d '{\"messages\":[{\"role\":\"wizard\",\"content\":\"hi\"}],\"max_tokens\":2}' $H/v1/chat/completions) = 400 ] && grep -q \"role 'wizard' is not one of system, developer, user, assistant, tool\" $T/body" "unknown role -> 400 naming it ($(cat "$T/body"))"
check "[ \$(curl -s -m 30 -o $T/body -w '%{http_code}' -d '{\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2}' $H/v1/chat/completions) = 200 ]" "developer role accepted ($(cat "$T/body"))"
# a model name other than the served one: 404 saying which one is served, as --help says
check "[ \$(curl -s -m 30 -o $T/body -w '%{http_code}' -d '{\"model\":\"default\",\"prompt\":\"x\",\"max_tokens\":1}' $H/v1/completions) = 404 ] && grep -q 'this server serves .qdelta-tiny.' $T/body" "wrong model -> 404 naming the served one ($(cat "$T/body"))"
check "[ \$(curl -s -m 30 -o /dev/null -w '%{http_code}' -d '{\"model\":\"qdelta-tiny\",\"prompt\":\"x\",\"max_tokens\":1}' $H/v1/completions) = 200 ]" "the served model name -> 200"
kill -TERM "$PID_H"
rcH=0; wait "$PID_H" || rcH=$?
check "[ $rcH = 0 ]" "server H exits 0 on SIGTERM"
"$Q" serve --help > "$T/help"
check "grep -q 'A request.s' $T/help && grep -q '\"model\" must be this id or be left out' $T/help && grep -q 'qdelta-tiny for the default model' $T/help" "serve --help says which model names requests may use"
check "grep -q -- '--no-prefix-cache' $T/help && grep -q 'On by default' $T/help" "serve --help documents the prefix cache default"

# ------------------------------------------------------------ the openai client suite
if python3 tests/test_server.py --url "$A" --api-key "$KEY" --tools-url "$B" --pid "$PID_A" --soak "$SOAK" \
     --soak-rss-check $((1 - ASAN)); then ok; else bad "tests/test_server.py"; fi
# structured outputs and enforced tool calls (openai + jsonschema clients)
if python3 tests/test_structured.py --url "$A" --api-key "$KEY" --tools-url "$B"; then ok; else bad "tests/test_structured.py"; fi

# ------------------------------------------------------------ graceful shutdown
# a stream is open when SIGTERM arrives: it ends (finish_reason abort + [DONE]) and the
# process exits 0 (under ASan: with no leak report)
"${C[@]}" -N -d '{"prompt":"Once","max_tokens":400,"temperature":0,"stream":true,"ignore_eos":true}' $A/v1/completions >"$T/open_stream" &
CURL=$!
for _ in $(seq 1 100); do grep -q 'data: ' "$T/open_stream" 2>/dev/null && break; sleep 0.05; done
kill -TERM "$PID_A" "$PID_B"
rcA=0; rcB=0
wait "$PID_A" || rcA=$?
wait "$PID_B" || rcB=$?
wait "$CURL" 2>/dev/null
check "[ $rcA = 0 ] && [ $rcB = 0 ]" "SIGTERM: servers exit 0 (A $rcA, B $rcB)"
check "grep -q 'data: \[DONE\]' $T/open_stream" "SIGTERM: the open stream was ended with [DONE]"
if [ $rcA != 0 ] || [ $rcB != 0 ]; then tail -n 30 "$T/A.err" "$T/B.err" >&2; fi

echo "cli_server: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
