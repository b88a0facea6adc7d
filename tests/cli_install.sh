#!/usr/bin/env bash
# cmake --install into a temporary prefix, then the installed binary moved elsewhere and
# run from another directory: it finds the default model relative to itself (not in the
# source tree it was built from), `bench` without -m uses it, and --version names the
# commit. $1 is the build tree's qdelta (its directory is the build tree).
set -u
Q="$1"
B=$(cd "$(dirname "$Q")" && pwd)
SRC=$(pwd) # ctest runs from the repository root
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }

# --version: the version and the commit of the checkout it was built from
"$Q" --version > "$T/version"
check "grep -q '^qdelta [0-9][0-9.]* (commit .*)$' $T/version" "--version prints 'qdelta X (commit C)': $(cat "$T/version")"
if git -C "$SRC" rev-parse --git-dir >/dev/null 2>&1; then
  want=$(git -C "$SRC" describe --always)
  check "grep -qF '(commit $want' $T/version" "--version names the commit $want: $(cat "$T/version")"
fi

cmake --install "$B" --prefix "$T/prefix" > "$T/install.log" 2>&1
rc=$?
check "[ $rc -eq 0 ]" "cmake --install into a temporary prefix"
check "[ -x $T/prefix/bin/qdelta ]" "bin/qdelta installed"
check "[ -f $T/prefix/share/qdelta/models/qdelta-tiny/model.safetensors ] && [ -f $T/prefix/share/qdelta/models/qdelta-tiny/tokenizer.json ]" "the default model installed under share/qdelta/models"

# relocated: the prefix moved after installing, run from an unrelated directory
mv "$T/prefix" "$T/moved"
I="$T/moved/bin/qdelta"
mkdir "$T/elsewhere"
"$Q" run -p "The sun" -n 12 --temperature 0 -q > "$T/built.txt"
(cd "$T/elsewhere" && "$I" run -p "The sun" -n 12 --temperature 0 -q) > "$T/installed.txt" 2> "$T/installed.err"
check "[ -s $T/installed.txt ] && cmp -s $T/built.txt $T/installed.txt" "the moved install generates as the build does ($(cat "$T/installed.err"))"
check "(cd $T/elsewhere && '$I' --version | grep -qF \"\$(cat $T/version)\")" "the installed --version is the build's"

# ... and the model it uses is the one beside it, not the source tree's: swap the
# installed model for a test checkpoint and the greedy ids follow it
FX="$SRC/tests/fixtures/qwen3_next_dense_flat_norenorm_bf16"
M="$T/moved/share/qdelta/models/qdelta-tiny"
rm -rf "$M" && mkdir "$M" && cp "$FX"/*.json "$FX"/*.safetensors "$M"/
"$Q" run -m "$FX" --prompt-ids "1 2 3" -n 4 --temperature 0 -q > "$T/fx.ids"
(cd "$T/elsewhere" && "$I" run --prompt-ids "1 2 3" -n 4 --temperature 0 -q) > "$T/swapped.ids"
check "[ -s $T/fx.ids ] && cmp -s $T/fx.ids $T/swapped.ids" "the installed binary loads the model under its own prefix ($(cat "$T/swapped.ids") vs $(cat "$T/fx.ids"))"

# bench without -m measures the default model, like the other commands
"$Q" bench --prefill 8 --decode 2 --context 8 -q > "$T/bench.out" 2> "$T/bench.err"
rc=$?
check "[ $rc -eq 0 ] && grep -q '^RESULT' $T/bench.out" "bench without -m runs on the default model ($(tail -n 2 "$T/bench.err"))"

echo "cli_install: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
