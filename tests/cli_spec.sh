#!/usr/bin/env bash
# Speculative decoding from the command line (--speculative-tokens K) on the MTP fixtures:
#   run: the ids at K = 1..4 are those of K = 0 (greedy), and stderr has the
#        'speculative:' line (acceptance %, mean accepted length) only when K > 0;
#   errors: a model without an MTP head (run, chat, serve, bench), K outside 0..4:
#        nonzero exit, a message naming why;
#   tensor parallel: run --tensor-parallel-size 2 (-tp 2) at K = 1..3 prints the
#        'speculative:' line and the unsplit model's greedy ids (fixtures, default model);
#   bench: engine decode tok/s with and without speculation, greedy outputs identical;
#   serve: completions (token-id prompts) at K = 2 equal those at K = 0, and /metrics
#        counts drafted, accepted and accepted-at-position tokens consistently.
set -u
Q="$1"
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
. "$(dirname "$0")/server_lib.sh" # T, start NAME ARGS..., stop_servers

# ------------------------------------------------------------------ run
for F in tests/fixtures_mtp/*/; do
  F=${F%/}
  P=$(cat "$F/prompt.ids")
  "$Q" run -m "$F" --prompt-ids "$P" -n 24 --speculative-tokens 0 > "$T/k0.ids" 2> "$T/k0.err"
  check "[ -s $T/k0.ids ] && ! grep -q '^speculative:' $T/k0.err" "$F K=0: ids, no speculative line"
  for K in 1 2 3 4; do
    "$Q" run -m "$F" --prompt-ids "$P" -n 24 --speculative-tokens $K > "$T/k.ids" 2> "$T/k.err"
    rc=$?
    check "[ $rc = 0 ] && cmp -s $T/k0.ids $T/k.ids" "$F K=$K: ids differ from K=0 ($(cat $T/k.err))"
    check "grep -Eq '^speculative: K=$K, [0-9]+ of [0-9]+ drafts accepted \([0-9.]+%\), mean accepted length [0-9.]+ tokens per verify step \(accepted drafts \+ 1 bonus token\)' $T/k.err" \
      "$F K=$K: the speculative line: $(grep speculative $T/k.err)"
  done
done
F=tests/fixtures_mtp/qwen3_5_dense_mtp
P=$(cat "$F/prompt.ids")
# drafting at every step (not by the measured costs) gives the same ids
"$Q" run -m "$F" --prompt-ids "$P" -n 24 --speculative-tokens 2 --speculative-always > "$T/ka.ids" 2> "$T/ka.err"
"$Q" run -m "$F" --prompt-ids "$P" -n 24 --speculative-tokens 0 > "$T/k0.ids" 2> /dev/null
check "cmp -s $T/k0.ids $T/ka.ids && grep -q '^speculative: K=2' $T/ka.err" "--speculative-always: $(cat $T/ka.err)"
# -q leaves the line out, as the other statistics
"$Q" run -m "$F" --prompt-ids "$P" -n 8 --speculative-tokens 2 -q > /dev/null 2> "$T/q.err"
check "! grep -q speculative $T/q.err" "-q prints no speculative line"

# the default model has a trained MTP head (models/qdelta-tiny/README.md): it speculates
"$Q" run -p "Hello" -n 8 --speculative-tokens 2 > /dev/null 2> "$T/d1"; rc=$?
check "[ $rc = 0 ] && grep -q '^speculative: K=2' $T/d1" "default model, K=2: $(cat $T/d1)"

# ------------------------------------------------------------------ errors
# a checkpoint without an MTP head (a tiny fixture with the Qwen3 tokenizer beside it)
NM="$T/nomtp"
mkdir -p "$NM"
for f in config.json model.safetensors; do ln -s "$PWD/tests/fixtures/qwen3_5_dense_bf16/$f" "$NM/$f"; done
for f in tokenizer.json tokenizer_config.json; do ln -s "$PWD/tests/data/qwen3-tokenizer/$f" "$NM/$f"; done
"$Q" run -m "$NM" --prompt-ids "1 2 3" -n 4 --speculative-tokens 2 > /dev/null 2> "$T/e1"; rc=$?
check "[ $rc != 0 ] && grep -q 'speculative decoding: the checkpoint has no MTP head' $T/e1" "run, no MTP head: $(cat $T/e1)"
echo "hi" | timeout 60 "$Q" chat -m "$NM" --speculative-tokens 2 > /dev/null 2> "$T/e2"; rc=$?
check "[ $rc != 0 ] && [ $rc != 124 ] && grep -q 'no MTP head' $T/e2" "chat, no MTP head: $(cat $T/e2)"
timeout 60 "$Q" bench -m "$NM" --prefill 16 --context 8 --decode 4 --speculative-tokens 2 -q > /dev/null 2> "$T/e3"; rc=$?
check "[ $rc != 0 ] && grep -q 'no MTP head' $T/e3" "bench, no MTP head: $(cat $T/e3)"
timeout 60 "$Q" serve -m "$NM" --port 0 -q --speculative-tokens 2 > /dev/null 2> "$T/e4"; rc=$?
check "[ $rc != 0 ] && [ $rc != 124 ] && grep -q 'no MTP head' $T/e4" "serve, no MTP head: $(cat $T/e4)"
"$Q" run -m "$F" --prompt-ids "1 2 3" -n 4 --speculative-tokens 5 > /dev/null 2> "$T/e5"; rc=$?
check "[ $rc = 2 ] && grep -q -- '--speculative-tokens expects an integer in \[0, 4\]' $T/e5" "K=5: $(cat $T/e5)"
"$Q" serve --port 0 -m "$F" --speculative-tokens -1 > /dev/null 2> "$T/e6"; rc=$?
check "[ $rc = 2 ] && grep -q -- '--speculative-tokens' $T/e6" "serve K=-1: $(cat $T/e6)"

# ------------------------------------------------------------------ tensor parallel
# a CPU split (the MTP head's layer sharded like the main layers) speculates, and its ids
# are the unsplit model's plain greedy ones
for F2 in tests/fixtures_mtp/qwen3_5_dense_mtp tests/fixtures_mtp/qwen3_next_moe_mtp; do
  P2=$(cat "$F2/prompt.ids")
  "$Q" run -m "$F2" --prompt-ids "$P2" -n 24 > "$T/tp0.ids" 2> /dev/null
  for K in 1 2 3; do
    "$Q" run -m "$F2" --prompt-ids "$P2" -n 24 --speculative-tokens $K --tensor-parallel-size 2 > "$T/tp.ids" 2> "$T/tp.err"; rc=$?
    check "[ $rc = 0 ] && [ -s $T/tp0.ids ] && cmp -s $T/tp0.ids $T/tp.ids && grep -q '^speculative: K=$K, ' $T/tp.err" \
      "$F2 -tp 2 K=$K: ids differ from the unsplit greedy ones or no speculative line ($(cat $T/tp.err))"
  done
done
"$Q" run -p "Hello, my name is" -n 24 --temperature 0 > "$T/dt0" 2> /dev/null
"$Q" run -p "Hello, my name is" -n 24 --temperature 0 -tp 2 --speculative-tokens 2 > "$T/dt2" 2> "$T/dt2.err"; rc=$?
check "[ $rc = 0 ] && [ -s $T/dt0 ] && cmp -s $T/dt0 $T/dt2 && grep -q '^speculative: K=2, ' $T/dt2.err" \
  "default model -tp 2 --speculative-tokens 2: $(cat $T/dt2.err)"

# a draft vocabulary: drafts among the first N ids only, the output unchanged; with N = 1
# every draft is id 0, so (almost) none is kept
"$Q" run -p "Hello, my name is" -n 24 --temperature 0 --speculative-tokens 2 > "$T/dv0" 2> "$T/dv0.err"
"$Q" run -p "Hello, my name is" -n 24 --temperature 0 --speculative-tokens 2 --speculative-draft-vocab 1 \
  > "$T/dv1" 2> "$T/dv1.err"; rc=$?
check "[ $rc = 0 ] && cmp -s $T/dt0 $T/dv1 && grep -q '^speculative: K=2, ' $T/dv1.err" \
  "--speculative-draft-vocab 1: output differs from plain greedy ($(cat $T/dv1.err))"
pct() { sed -n 's/^speculative: .* accepted (\([0-9.]*\)%).*/\1/p' "$1"; }
check "awk -v a=\"$(pct $T/dv0.err)\" -v b=\"$(pct $T/dv1.err)\" 'BEGIN { exit !(a != \"\" && b != \"\" && b + 0 < a + 0) }'" \
  "draft vocabulary of 1 id keeps fewer drafts: $(cat $T/dv0.err) / $(cat $T/dv1.err)"
"$Q" run -p "Hello" -n 4 --speculative-tokens 2 --speculative-draft-vocab 999999 > /dev/null 2> "$T/dvbad.err"; rc=$?
check "[ $rc != 0 ] && grep -q 'speculative_draft_vocab 999999 is not in 0..' $T/dvbad.err" \
  "a draft vocabulary past the model's is refused: $(cat $T/dvbad.err)"

# ------------------------------------------------------------------ bench
"$Q" bench -m "$F" --prefill 32 --context 16 --decode 24 --batch 3 --speculative-tokens 3 -q > "$T/bench" 2>&1; rc=$?
re='^RESULT spec_decode B=3 ctx=16 K=3 tok_s_plain=[0-9.]+ tok_s_spec=[0-9.]+ .* same=1 fwd_ms_plain=[0-9.]+ '
re+='fwd_ms_spec=[0-9.]+ mtp_ms_spec=[0-9.]+ dec_ms_plain=[0-9.]+ dec_ms_spec=[0-9.]+ dec_mtp_ms_spec=[0-9.]+ '
re+='draft_vocab=0 always=0 plain_steps=[0-9]+ steps=[0-9]+ mtp_forwards=[0-9]+ verify_GB=[0-9.]+ '
re+='verify_roof_ms=[0-9.]+ verify_x_roof=[0-9.]+ spec_x_roof=[0-9.]+$'
check "[ $rc = 0 ] && grep -Eq '$re' $T/bench" \
  "bench --speculative-tokens: $(tail -3 $T/bench)"
check "grep -q 'tok/s without speculation, .* tok/s with K=3' $T/bench" "bench prints both rates"
# the verify step's roofline: the weights, 4 tokens' states and KV; more bytes than a plain step's
vgb=$(sed -n 's/^RESULT spec_decode .* verify_GB=\([0-9.]*\) .*/\1/p' $T/bench)
pgb=$(sed -n 's/^RESULT decode .* GB_per_step=\([0-9.]*\) .*/\1/p' $T/bench)
check "awk -v v=\"$vgb\" -v p=\"$pgb\" 'BEGIN { exit !(v + 0 > p + 0 && p + 0 > 0) }'" \
  "bench --speculative-tokens: the verify step's roofline bytes ($vgb GB) exceed a plain step's ($pgb GB)"
re='^  verify roofline: [0-9.]+ GB a step over [0-9]+ GB/s = [0-9.]+ ms; the verify forward takes [0-9.]+x it'
check "grep -Eq '$re' $T/bench" \
  "bench prints the verify roofline: $(grep verify $T/bench)"

# ------------------------------------------------------------------ serve
# the fixture with a tokenizer beside it (its 320 ids are byte tokens of Qwen3's)
M="$T/model"
mkdir -p "$M"
for f in config.json model.safetensors; do ln -s "$PWD/$F/$f" "$M/$f"; done
for f in tokenizer.json tokenizer_config.json; do ln -s "$PWD/tests/data/qwen3-tokenizer/$f" "$M/$f"; done
start S0 -m "$M" --max-model-len 256 --max-num-seqs 4
start S2 -m "$M" --max-model-len 256 --max-num-seqs 4 --speculative-tokens 2
for i in 1 2 3; do
  body="{\"prompt\":[$(echo $P | cut -d' ' -f1-$((10 * i)) | tr ' ' ',')],\"max_tokens\":$((8 + 5 * i)),\"temperature\":0}"
  curl -s -m 60 "http://127.0.0.1:$PORT_S0/v1/completions" -d "$body" | sed 's/"created":[0-9]*,//; s/"id":"[^"]*",//' > "$T/c0.$i"
  curl -s -m 60 "http://127.0.0.1:$PORT_S2/v1/completions" -d "$body" | sed 's/"created":[0-9]*,//; s/"id":"[^"]*",//' > "$T/c2.$i"
  check "grep -q '\"finish_reason\":\"length\"' $T/c2.$i && cmp -s $T/c0.$i $T/c2.$i" "serve K=2 completion $i: $(cat $T/c2.$i) vs $(cat $T/c0.$i)"
done
curl -s -m 10 "http://127.0.0.1:$PORT_S2/metrics" > "$T/m2"
curl -s -m 10 "http://127.0.0.1:$PORT_S0/metrics" > "$T/m0"
val() { sed -n "s/^$1 \([0-9.e+]*\)$/\1/p" "$2"; }
D=$(val qdelta_spec_draft_tokens_total "$T/m2")
A=$(val qdelta_spec_accepted_tokens_total "$T/m2")
V=$(val qdelta_spec_verify_steps_total "$T/m2")
AT=0
for p in 0 1 2 3; do AT=$((AT + $(val "qdelta_spec_accepted_at_position_total{position=\"$p\"}" "$T/m2"))); done
check "[ -n \"$D\" ] && [ \"$D\" -gt 0 ] && [ \"$A\" -le \"$D\" ] && [ \"$D\" -le \$((2 * $V)) ] && [ \"$A\" = \"$AT\" ]" \
  "serve K=2 /metrics: drafted $D, accepted $A (by position $AT), verify steps $V"
check "[ \"$(val qdelta_spec_draft_tokens_total "$T/m0")\" = 0 ] && grep -q '^# TYPE qdelta_spec_accepted_at_position_total counter' $T/m0" \
  "serve K=0 /metrics: the counters exist and stay 0"
check "grep -Eq '^qdelta_spec_plain_steps_total [0-9]+' $T/m2" "serve K=2 /metrics: no plain-steps counter"
stop_servers || bad "servers did not exit 0 on SIGTERM"

echo "cli_spec: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
