#!/usr/bin/env bash
# -m ORG/NAME from the local Hugging Face cache (laid out in a temporary directory the
# way huggingface_hub writes it: refs/ naming commits, snapshots/ of symlinks into
# blobs/), with HF_HUB_CACHE, HF_HOME and ~/.cache; --revision by branch and by commit;
# the message when a model is not there; plain directories as before; and the progress
# shown while a multi-shard checkpoint is read. $1 is the qdelta binary.
set -u
Q="$1"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
unset HF_HUB_CACHE HUGGINGFACE_HUB_CACHE HF_HOME XDG_CACHE_HOME

TINY=models/qdelta-tiny
FX=tests/fixtures/qwen3_next_dense_flat_norenorm_bf16 # two shards, another model

# snapshot REPO_DIR COMMIT SRC_DIR FILES...: files of SRC_DIR as blobs named by their
# sha256, linked from snapshots/COMMIT/ (relative links, as the hub makes them)
snapshot() {
  local repo=$1 commit=$2 src=$3; shift 3
  mkdir -p "$repo/blobs" "$repo/refs" "$repo/snapshots/$commit"
  for f in "$@"; do
    local h
    h=$(sha256sum "$src/$f" | cut -d' ' -f1)
    cp "$src/$f" "$repo/blobs/$h"
    ln -s "../../blobs/$h" "$repo/snapshots/$commit/$f"
  done
}
C1=0123456789abcdef0123456789abcdef01234567
C2=fedcba9876543210fedcba9876543210fedcba98
HUB="$T/hub"
R="$HUB/models--Qwen--Qwen3-Tiny"
snapshot "$R" $C1 $TINY config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json
snapshot "$R" $C2 $FX config.json generation_config.json model.safetensors.index.json \
  model-00001-of-00002.safetensors model-00002-of-00002.safetensors
printf '%s' $C1 > "$R/refs/main"
printf '%s\n' $C2 > "$R/refs/v2"

run_ids() { "$Q" run --prompt-ids "1 2 3" -n 4 --temperature 0 -q "$@"; }
run_ids -m $TINY > "$T/tiny.ids"
run_ids -m $FX > "$T/fx.ids"
check "[ -s $T/tiny.ids ] && ! cmp -s $T/tiny.ids $T/fx.ids" "the two test models answer differently"

HF_HUB_CACHE="$HUB" run_ids -m Qwen/Qwen3-Tiny > "$T/a.ids" 2> "$T/a.err"
check "cmp -s $T/tiny.ids $T/a.ids" "HF_HUB_CACHE: Qwen/Qwen3-Tiny is refs/main's snapshot ($(cat "$T/a.err"))"
HF_HUB_CACHE="$HUB" run_ids -m Qwen/Qwen3-Tiny --revision v2 > "$T/b.ids" 2> "$T/b.err"
check "cmp -s $T/fx.ids $T/b.ids" "--revision v2 follows refs/v2 ($(cat "$T/b.err"))"
HF_HUB_CACHE="$HUB" run_ids -m Qwen/Qwen3-Tiny --revision $C2 > "$T/c.ids" 2> "$T/c.err"
check "cmp -s $T/fx.ids $T/c.ids" "--revision COMMIT picks that snapshot ($(cat "$T/c.err"))"
mkdir -p "$T/home"
mv "$HUB" "$T/home/hub"
HF_HOME="$T/home" run_ids -m Qwen/Qwen3-Tiny > "$T/d.ids" 2> "$T/d.err"
check "cmp -s $T/tiny.ids $T/d.ids" "HF_HOME/hub ($(cat "$T/d.err"))"
mkdir -p "$T/user/.cache/huggingface"
mv "$T/home/hub" "$T/user/.cache/huggingface/hub"
HOME="$T/user" run_ids -m Qwen/Qwen3-Tiny > "$T/e.ids" 2> "$T/e.err"
check "cmp -s $T/tiny.ids $T/e.ids" "~/.cache/huggingface/hub by default ($(cat "$T/e.err"))"
HUB="$T/user/.cache/huggingface/hub"
check "HF_HUB_CACHE='$HUB' '$Q' tokenize -m Qwen/Qwen3-Tiny <(printf 'Hello') | grep -q '^[0-9]'" "tokenize takes a model name too"

# not in the cache: a clear message naming the model, where it looked, and what to do
HF_HUB_CACHE="$HUB" run_ids -m Qwen/Not-There > "$T/m.out" 2> "$T/m.err"
rc=$?
check "[ $rc -ne 0 ] && grep -q \"model 'Qwen/Not-There'\" $T/m.err && grep -qF '$HUB/models--Qwen--Not-There/refs/main' $T/m.err && grep -q 'downloads' $T/m.err" "missing model: message ($(head -c 400 "$T/m.err"))"
HF_HUB_CACHE="$HUB" run_ids -m Qwen/Qwen3-Tiny --revision nope > /dev/null 2> "$T/r.err"
rc=$?
check "[ $rc -ne 0 ] && grep -q \"revision 'nope'\" $T/r.err" "missing revision: message ($(head -c 300 "$T/r.err"))"
mkdir -p "$T/broken" && cp -r "$HUB/models--Qwen--Qwen3-Tiny" "$T/broken/" && rm -rf "$T/broken/models--Qwen--Qwen3-Tiny/snapshots/$C1"
HF_HUB_CACHE="$T/broken" run_ids -m Qwen/Qwen3-Tiny > /dev/null 2> "$T/i.err"
rc=$?
check "[ $rc -ne 0 ] && grep -q 'interrupted download' $T/i.err" "refs/main naming an absent snapshot: message ($(head -c 300 "$T/i.err"))"

# a plain directory keeps working, relative or absolute, and --revision does not apply to it
run_ids -m "$(pwd)/$TINY" > "$T/p.ids"
check "cmp -s $T/tiny.ids $T/p.ids" "an absolute directory"
check "! run_ids -m $TINY --revision main >/dev/null 2>$T/rv.err && grep -q 'revision' $T/rv.err" "--revision with a directory is refused"
check "! run_ids -m $T/no/such/dir >/dev/null 2>$T/nd.err && grep -qF '$T/no/such/dir' $T/nd.err" "a missing directory is named"

# progress while the shards are read: plain lines when stderr is not a terminal,
# nothing with -q, a bar (carriage returns, rate, ETA) on a terminal
"$Q" run -m $FX --prompt-ids "1 2 3" -n 1 --temperature 0 > /dev/null 2> "$T/pg.err"
check "grep -q '^loading: shard 1/2 read' $T/pg.err && grep -q '^loading: shard 2/2 read, .* (100%), .*/s, ETA' $T/pg.err && grep -q '^loading: 2 shards, .* read in' $T/pg.err" "plain progress lines ($(cat "$T/pg.err"))"
check "! grep -q \$'\\r' $T/pg.err" "no carriage returns when not a terminal"
"$Q" run -m $FX --prompt-ids "1 2 3" -n 1 --temperature 0 -q > /dev/null 2> "$T/pq.err"
check "[ ! -s $T/pq.err ]" "-q prints nothing while loading ($(cat "$T/pq.err"))"
if command -v script >/dev/null 2>&1; then
  script -qec "'$Q' run -m $FX --prompt-ids '1 2 3' -n 1 --temperature 0" /dev/null > "$T/tty.out" 2>&1
  check "grep -q \$'\\rloading \\[#' $T/tty.out && grep -q 'shard 2/2' $T/tty.out && grep -q 'ETA' $T/tty.out" "a progress bar on a terminal ($(tr '\r' '|' < "$T/tty.out" | head -c 300))"
fi

echo "cli_models: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
