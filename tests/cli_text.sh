#!/usr/bin/env bash
# The text CLI end to end on the embedded default model and the real Qwen3 tokenizer:
# --help everywhere, tokenize/detokenize round trip, render-chat, run with text,
# seeds, stop strings, chat over a pipe with prefix reuse, Ctrl-C during a reply.
set -u
Q="$1"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }

for c in logits run chat bench tokenize detokenize render-chat; do
  check "'$Q' $c --help >/dev/null" "$c --help"
done

# bench's mixed steps (decodes beside prompt tokens, a serving step's shape): a RESULT line
# with the step's shape, and the value checked
"$Q" bench --prefill 16 --decode 3 --batch 2 --context 24 --mixed 50 > "$T/mixed.txt" 2>&1
check "grep -Eq '^RESULT mixed backend=cpu B=2 ctx=24 prefill=50 step_ms=[0-9.]+ tok_s=[0-9.]+' $T/mixed.txt" \
  "bench --mixed reports the mixed step"
check "grep -q '(3 sequences)' $T/mixed.txt && ! grep -q '^RESULT decode' $T/mixed.txt" "bench --mixed: 50 prompt tokens in 3 sequences of <= 24"
check "! '$Q' bench --mixed x >/dev/null 2>$T/err && grep -q -- '--mixed' $T/err" "bench rejects a bad --mixed"

# tokenizer round trip through the CLI (the Qwen3 tokenizer in tests/data; ctest runs from the root)
QT=tests/data/qwen3-tokenizer
printf 'Hello, world! ça va? 数学 😀\n  indented\tcode() <|im_start|>user\n' > "$T/a.txt"
printf 'second file' > "$T/b.txt"
check "[ \$('$Q' tokenize -m $QT $T/a.txt $T/b.txt | wc -l) -eq 2 ]" "tokenize prints one line per file"
"$Q" tokenize -m $QT "$T/a.txt" > "$T/a.ids"
check "grep -q ' 151644 ' $T/a.ids" "special token inside text matched as one id"
"$Q" detokenize -m $QT "$T/a.ids" > "$T/a.out"
check "cmp -s $T/a.txt $T/a.out" "detokenize(tokenize(text)) == text"

# render-chat on the default model's ChatML template: exact bytes
cat > "$T/req.json" <<'JSON'
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}],
 "add_generation_prompt": true}
JSON
printf '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n' > "$T/want.txt"
"$Q" render-chat --request "$T/req.json" > "$T/got.txt"
check "cmp -s $T/want.txt $T/got.txt" "render-chat output exact"
echo '{"messages": 5}' > "$T/badreq.json"
check "! '$Q' render-chat --request $T/badreq.json >/dev/null 2>$T/err" "render-chat rejects bad messages"

# run with a text prompt on the embedded default model
"$Q" run -p "The sun" -n 24 --temperature 0 > "$T/run.txt" 2> "$T/run.err"
check "grep -q '^The sun' $T/run.txt" "run echoes the prompt then continues"
check "grep -q 'time to first token' $T/run.err" "run reports tok/s and time to first token"
check "[ \$(wc -c < $T/run.txt) -gt 20 ]" "run generated text"
"$Q" run -p "Once" -n 20 --temperature 0.9 --seed 7 -q > "$T/s1.txt"
"$Q" run -p "Once" -n 20 --temperature 0.9 --seed 7 -q > "$T/s2.txt"
check "cmp -s $T/s1.txt $T/s2.txt" "same seed, same output"
# stop string: take a word from the greedy output and stop on it
word=$(sed -n '1p' "$T/run.txt" | awk '{print $4}')
if [ -n "$word" ]; then
  "$Q" run -p "The sun" -n 24 --temperature 0 --stop "$word" -q > "$T/stop.txt"
  check "! grep -q -- ' $word' $T/stop.txt" "stop string '$word' not emitted"
  check "[ \$(wc -c < $T/stop.txt) -lt \$(wc -c < $T/run.txt) ]" "stop string ends the output early"
fi
check "! '$Q' run -p x --temperature -1 -q >/dev/null 2>$T/err && grep -q temperature $T/err" "bad temperature named"
check "! '$Q' run -p x --top-p 0 -q >/dev/null 2>$T/err && grep -q top_p $T/err" "bad top_p named"

# chat over a pipe: two turns, the second reuses the first turn's state
printf 'What is Python?\nAnd the sun?\n' | "$Q" chat -n 16 --temperature 0 > "$T/chat.out" 2> "$T/chat.err"
check "[ \$? -eq 0 ]" "chat exits 0 at end of input"
check "[ \$(grep -c 'prompt tokens computed' $T/chat.err) -eq 2 ]" "chat answered two turns"
second=$(sed -n '2s/^\[\([0-9]*\) prompt.*/\1/p' "$T/chat.err")
first=$(sed -n '1s/^\[\([0-9]*\) prompt.*/\1/p' "$T/chat.err")
check "[ -n '$second' ] && [ '$second' -lt 40 ]" "second turn computed only the new tokens ($second)"

# Ctrl-C interrupts a long reply without ending the session
mkfifo "$T/in"
"$Q" chat -n 4000 --ignore-eos --ctx-size 8192 --temperature 0 < "$T/in" > "$T/int.out" 2> "$T/int.err" &
pid=$!
exec 3> "$T/in"
echo "Tell me a story." >&3
# interrupt once the reply is streaming (a loaded machine may take seconds to get there)
for _ in $(seq 600); do [ -s "$T/int.out" ] && break; sleep 0.1; done
sleep 0.3
kill -INT $pid
sleep 0.5
echo "Hi" >&3
exec 3>&-
wait $pid
rc=$?
check "[ $rc -eq 0 ]" "chat survives Ctrl-C and exits 0 at end of input (rc $rc)"
check "grep -q 'interrupted' $T/int.out" "the interrupted reply is marked"
check "[ \$(grep -c 'prompt tokens computed' $T/int.err) -eq 2 ]" "the next turn is answered after Ctrl-C"

echo "cli_text: $pass passed, $fail failed"
[ $fail -eq 0 ]
