#!/usr/bin/env bash
# qdelta bench --json-schema FILE on the default model (CPU): engine decode tok/s with and
# without the schema on every request at batch 1 and 4, every constrained output parses
# as JSON (the bench checks it and says so; here the RESULT line is read back), and the
# errors: a schema file that is not JSON, a schema the compiler refuses, a tokenizer
# directory that does not exist: nonzero exit and a message naming what is wrong.
set -u
Q="$1"
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

cat > "$T/schema.json" <<'JSON'
{"type":"object","properties":{"name":{"type":"string","minLength":20},
 "tags":{"type":"array","items":{"type":"string","maxLength":6},"minItems":2},
 "n":{"type":"integer","minimum":0,"maximum":99}},"required":["name","tags","n"]}
JSON
for B in 1 4; do
  "$Q" bench --prefill 16 --decode 40 --batch $B --context 16 --json-schema "$T/schema.json" > "$T/out" 2> "$T/err"
  rc=$?
  check "[ $rc = 0 ]" "batch $B: exit $rc: $(cat $T/err)"
  R=$(grep '^RESULT schema_decode' "$T/out")
  check "echo '$R' | grep -Eq 'B=$B ctx=16 tok_s_plain=[0-9]+\.[0-9]+ tok_s_schema=[0-9]+\.[0-9]+ tokens_schema=[0-9]+ parsed=$B tok_s_plain_all=[0-9]+\.[0-9]+ tok_s_schema_all=[0-9]+\.[0-9]+\$'" \
    "batch $B: the RESULT line: '$R'"
  # both figures are real rates and the constrained run generated tokens
  check "echo '$R' | awk '{split(\$5,a,\"=\"); split(\$6,b,\"=\"); split(\$7,c,\"=\"); split(\$9,d,\"=\"); split(\$10,e,\"=\"); exit !(a[2] > 0 && b[2] > 0 && c[2] >= $B * 10 && d[2] > 0 && e[2] > 0)}'" \
    "batch $B: positive tok/s and tokens: '$R'"
  check "grep -Eq 'tok/s without a schema, [0-9.]+ tok/s with .*schema.json .*$B of $B parse as JSON' $T/out" \
    "batch $B: the summary line: $(grep 'engine decode' $T/out)"
done

echo '{"type":' > "$T/broken.json"
"$Q" bench --prefill 16 --decode 8 --context 16 --json-schema "$T/broken.json" > /dev/null 2> "$T/err"; rc=$?
check "[ $rc != 0 ] && grep -q 'json-schema .*broken.json' $T/err" "a schema file that is not JSON: exit $rc, $(cat $T/err)"
echo '{"type":"string","pattern":"\\p{L}"}' > "$T/refused.json"
"$Q" bench --prefill 16 --decode 8 --context 16 --json-schema "$T/refused.json" > /dev/null 2> "$T/err"; rc=$?
check "[ $rc != 0 ] && grep -q 'refused.json: .*pattern' $T/err" "a schema the compiler refuses: exit $rc, $(cat $T/err)"
"$Q" bench --prefill 16 --decode 8 --context 16 --json-schema "$T/schema.json" --tokenizer "$T/none" > /dev/null 2> "$T/err"; rc=$?
check "[ $rc != 0 ] && grep -q 'tokenizer' $T/err" "a missing tokenizer: exit $rc, $(cat $T/err)"

echo "cli_bench_schema: $pass passed, $fail failed"
[ $fail = 0 ]
