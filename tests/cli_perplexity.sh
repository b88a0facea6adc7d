#!/usr/bin/env bash
# qdelta perplexity on the default model:
# - the held-out reference protocol (64 disjoint windows of 256 ids, models/qdelta-tiny/README.md) gives the
#   perplexity transformers computed (reference/heldout_ppl.txt) within 1e-5, from --ids and from --file;
# - strided windows: every token after the first scored once, and the mean NLL and KL / top-1 agreement
#   against a base equal what a script computes from `qdelta logits` of each window (float64), for the
#   model against itself (KL 0) and the model quantized to FP8 at load against its BF16 original;
# - bad options refused with a message naming what is wrong.
set -u
Q="$1"
. "$(dirname "$0")/server_lib.sh"
M=models/qdelta-tiny

"$Q" perplexity -q --ids $M/reference/heldout.ids --ctx 256 --stride 256 --json >"$T/ref.json" 2>"$T/err" || bad "reference run: $(cat "$T/err")"
"$Q" perplexity -q --file $M/reference/heldout.txt --ctx 256 --stride 256 --json >"$T/ref_text.json" 2>"$T/err" || bad "reference run from the text: $(cat "$T/err")"
check "python3 - '$T/ref.json' '$T/ref_text.json' '$M/reference/heldout_ppl.txt' <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
ref = float(open(sys.argv[3]).read())
ok = a['tokens'] == 16320 and a['windows'] == 64 and abs(a['perplexity'] / ref - 1) < 1e-5 and a == b
print(a, ref, file=sys.stderr) if not ok else None
sys.exit(0 if ok else 1)
PY" "reference protocol: perplexity within 1e-5 of transformers', 16320 tokens, the same from the text"

# strided windows over the first 700 held-out ids, against a script over `qdelta logits` of each window
head -c 100000 $M/reference/heldout.ids | tr ' ' '\n' | head -n 700 | tr '\n' ' ' >"$T/ids"
for q in none fp8; do
  "$Q" perplexity -q --ids "$T/ids" --ctx 96 --stride 40 --base $M --quantization $q --json >"$T/s_$q.json" 2>"$T/err" ||
    bad "strided run ($q): $(cat "$T/err")"
done
check "python3 - '$Q' '$T' <<'PY'
import json, struct, subprocess, sys, math
q, t = sys.argv[1], sys.argv[2]
ids = [int(x) for x in open(t + '/ids').read().split()]
V = None
def logits(window, quant):
    open(t + '/w.ids', 'w').write(' '.join(map(str, window)))
    extra = ['--quantization', 'fp8'] if quant else []
    subprocess.run([q, 'logits', '-q', '--ids', t + '/w.ids', '-o', t + '/w.f32'] + extra, check=True)
    raw = open(t + '/w.f32', 'rb').read()
    n = len(raw) // 4 // len(window)
    vals = struct.unpack('<%df' % (len(raw) // 4), raw)
    return [vals[i * n:(i + 1) * n] for i in range(len(window))]
def lsm(row):
    m = max(row)
    lse = m + math.log(sum(math.exp(x - m) for x in row))
    return [x - lse for x in row]
ok = True
for quant, name in ((0, 'none'), (1, 'fp8')):
    got = json.load(open(t + '/s_%s.json' % name))
    nll = bnll = kl = 0.0
    agree = tokens = windows = 0
    scored, begin = 1, 0
    while scored < len(ids):
        end = min(begin + 96, len(ids))
        if end > scored:
            w = ids[begin:end]
            lm, lb = logits(w, quant), logits(w, 0)
            for p in range(max(scored, begin + 1), end):
                a, b = lsm(lm[p - begin - 1]), lsm(lb[p - begin - 1])
                nll -= a[ids[p]]; bnll -= b[ids[p]]
                kl += sum(math.exp(y) * (y - x) for x, y in zip(a, b))
                agree += a.index(max(a)) == b.index(max(b)); tokens += 1
            windows += 1
            scored = end
        begin += 40
    want = {'tokens': tokens, 'windows': windows, 'nll': nll / tokens, 'base_nll': bnll / tokens,
            'kl_mean': kl / tokens, 'top1_agreement': agree / tokens}
    for k, v in want.items():
        if abs(got[k] - v) > 1e-6 * max(1, abs(v)):
            ok = False
            print(name, k, got[k], v, file=sys.stderr)
    if quant == 0 and (got['kl_mean'] != 0 or got['top1_agreement'] != 1):
        ok = False
    if quant == 1 and not (0 < got['kl_mean'] < 0.1 and 0.8 < got['top1_agreement'] < 1):
        ok = False
        print(got, file=sys.stderr)
ok = ok and tokens == len(ids) - 1
sys.exit(0 if ok else 1)
PY" "strided windows: each token once, NLL, KL and top-1 agreement as a script computes them from the logits"

# the rows' host pass on 1, 3 and 7 threads: the same figures to the last digit
for th in 1 3 7; do
  "$Q" perplexity -q -t $th --ids "$T/ids" --ctx 96 --stride 40 --base $M --quantization fp8 --json >"$T/t$th.json" \
    2>"$T/err" || bad "strided run on $th threads: $(cat "$T/err")"
done
check "cmp -s '$T/t1.json' '$T/t3.json' && cmp -s '$T/t1.json' '$T/t7.json' && cmp -s '$T/t1.json' '$T/s_fp8.json'" \
  "the figures do not depend on the number of threads"

# refused
err() { ! "$Q" perplexity -q "$@" >/dev/null 2>"$T/err"; }
check "err --ids '$T/ids' --ctx 64 --stride 65 && grep -q -- '--stride 65 is longer than --ctx 64' '$T/err'" "stride past ctx"
check "err && grep -q -- '--file' '$T/err'" "no text"
check "err --ids '$T/ids' --file x && grep -q 'one of them' '$T/err'" "both --ids and --file"
echo "1 2 99999" >"$T/bad.ids"
check "err --ids '$T/bad.ids' && grep -q 'outside the vocabulary' '$T/err'" "an id past the vocabulary"
echo "5" >"$T/one.ids"
check "err --ids '$T/one.ids' && grep -q 'nothing to score' '$T/err'" "one token"
check "err --ids '$T/ids' --ctx 2048 --stride 2048 && grep -q 'fill no window' '$T/err'" "no whole window"
check "err --ids '$T/ids' --base tests/fixtures/qwen3_5_dense_f32 && grep -q 'not one vocabulary' '$T/err'" "a base of another vocabulary"
echo "cli_perplexity: $pass passed, $fail failed"
[ "$fail" = 0 ]
