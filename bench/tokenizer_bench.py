#!/usr/bin/env python3
"""HF `tokenizers` side of the tokenizer benchmark, and the benchmark text.

    python3 bench/tokenizer_bench.py make-text OUT.txt [--mb 8]
    TOKENIZERS_PARALLELISM=false python3 bench/tokenizer_bench.py hf TOKENIZER_JSON TEXT [--ids-out IDS.bin]

make-text mixes the generated tokenizer test strings (every script, emoji,
whitespace, code; tools/gen_tokenizer_cases.py) with real English prose and
code from the Python standard library and /usr/share/common-licenses.
`hf` times single-threaded encode (one call on the whole text, then one call
per line; encode_batch is not used) and decode, and writes the ids of the
whole-text encoding for bench/tokenizer_bench.c to compare.
"""
import argparse
import array
import glob
import os
import random
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def make_text(out, mb):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
    import gen_tokenizer_cases as g
    rng = random.Random(1234)
    target = int(mb * 1e6)
    multi = "\n".join(g.gen_strings(rng, 4000, ["<|im_start|>", "<|im_end|>", "<think>"]))
    prose = ""
    for p in sorted(glob.glob("/usr/share/common-licenses/*")):
        try:
            prose += open(p, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError):
            pass
    code = ""
    for p in sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))[:300]:
        try:
            code += open(p, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError):
            pass
    parts, size = [], 0
    while size < target:  # roughly 30% multilingual cases, 30% prose, 40% code
        for chunk in (multi, prose, code[:len(code) // 2], code[len(code) // 2:]):
            parts.append(chunk)
            size += len(chunk.encode())
    text = "".join(parts).encode()[:target].decode("utf-8", "ignore")
    open(out, "w", encoding="utf-8", newline="").write(text)
    print("%s: %.1f MB, %d lines" % (out, len(text.encode()) / 1e6, text.count("\n")))


def hf(tokenizer, text_path, ids_out):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer)
    text = open(text_path, encoding="utf-8", newline="").read()
    mb = len(text.encode()) / 1e6
    best = 1e30
    for r in range(3):
        t0 = time.perf_counter()
        ids = tok.encode(text, add_special_tokens=False).ids
        best = min(best, time.perf_counter() - t0)
    print("HF encode whole: %.1f MB in %.3f s = %.2f MB/s, %d tokens" % (mb, best, mb / best, len(ids)))
    lines = text.splitlines(keepends=True)
    t0 = time.perf_counter()
    n = 0
    for line in lines:
        n += len(tok.encode(line, add_special_tokens=False).ids)
    tl = time.perf_counter() - t0
    print("HF encode by line: %d lines, %.2f MB/s, %d tokens" % (len(lines), mb / tl, n))
    best = 1e30
    for r in range(3):
        t0 = time.perf_counter()
        dec = tok.decode(ids, skip_special_tokens=False)
        best = min(best, time.perf_counter() - t0)
    print("HF decode: %.2f MB/s" % (len(dec.encode()) / 1e6 / best))
    if ids_out:
        array.array("i", ids).tofile(open(ids_out, "wb"))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-text")
    m.add_argument("out")
    m.add_argument("--mb", type=float, default=8)
    h = sub.add_parser("hf")
    h.add_argument("tokenizer")
    h.add_argument("text")
    h.add_argument("--ids-out")
    a = ap.parse_args()
    if a.cmd == "make-text":
        make_text(a.out, a.mb)
    else:
        hf(a.tokenizer, a.text, a.ids_out)


if __name__ == "__main__":
    main()
