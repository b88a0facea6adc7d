#!/usr/bin/env bash
# Compares ptxas' register spills of every kernel instance between a revision and the working
# tree, for the CUDA sources the change touches (directly or through a header), without a GPU:
# a change timed on one instance can push another (a batch size, a format) into local memory.
#
#   scripts/kernel-spills.sh [REV]        REV defaults to HEAD; prints instances whose spill
#                                         stores / loads (bytes) differ, REV -> tree
#   FILES="gemv_fused moe_decode_bf16" scripts/kernel-spills.sh REV   only these sources
#
# Needs nvcc (sm_90a); writes only under a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/base" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git worktree add -q --detach "$tmp/base" "$rev"
if [ -z "${FILES:-}" ]; then
    changed=$(git diff --name-only "$rev" -- src/backend/cuda | sed 's|.*/||')
    # and the headers that include a changed one, to a fixed point
    grown=1
    while [ $grown = 1 ]; do
        grown=0
        for h in src/backend/cuda/*.cuh src/backend/cuda/*.h; do
            hb=$(basename "$h")
            case " $(echo $changed) " in *" $hb "*) continue ;; esac
            for c in $changed; do
                if grep -q "#include \"backend/cuda/$c\"" "$h"; then changed="$changed $hb"; grown=1; break; fi
            done
        done
    done
    files=""
    for f in src/backend/cuda/*.cu; do
        b=$(basename "$f" .cu)
        for c in $changed; do
            if [ "$c" = "$b.cu" ] || grep -q "#include \"backend/cuda/$c\"" "$f" \
                || { [ -f "$tmp/base/$f" ] && grep -q "#include \"backend/cuda/$c\"" "$tmp/base/$f"; }; then
                files="$files $b"
                break
            fi
        done
    done
else
    files=$FILES
fi
[ -n "$files" ] || { echo "no CUDA source differs from $rev"; exit 0; }
spills() { # tree file -> "instance stores/loads" lines
    (cd "$1" && nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude --resource-usage \
        -c "src/backend/cuda/$2.cu" -o "$tmp/o.o" 2>&1 |
        awk '/Function properties for/ { n = $NF } /spill stores/ { print n, $5 "/" $9 }')
}
n=0
for f in $files; do
    [ -f "$tmp/base/src/backend/cuda/$f.cu" ] || { echo "$f.cu: new in the tree"; continue; }
    spills "$tmp/base" "$f" | sort >"$tmp/a"
    spills . "$f" | sort >"$tmp/b"
    join -a 1 -a 2 -e - -o 0,1.2,2.2 "$tmp/a" "$tmp/b" | awk -v f="$f" '$2 != $3 { printf "%-18s %-70.70s %9s -> %s\n", f, $1, $2, $3 }'
    n=$((n + 1))
done
echo "compared $n source(s) against $rev:$files"
