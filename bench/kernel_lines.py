#!/usr/bin/env python3
"""Where a kernel's warps wait, line by line of its SASS.

Reads Nsight Compute's source page as CSV (`ncu -i REPORT --page source --csv
--print-source sass`) on stdin or from a file, and prints for each profiled kernel:
the instructions its warps executed, its stall samples by reason, and the SASS lines
with the most samples (offset from the kernel's first line, executed count, samples,
the two largest reasons). A line with many samples is where warps sat; the reason says
on what (long_sb: a global or local load, barrier: __syncthreads, membar: a fence,
wait / short_sb / math: the instructions' own latencies).

    kernel_lines.py [--top N] [FILE]
"""
import argparse
import csv
import sys
from collections import Counter

from kernel_profile import short_name  # the same names as the per-kernel profile's


def sections(rows):
    """(kernel name, header, body rows) for each kernel of the page."""
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"]
    for j, a in enumerate(starts):
        b = starts[j + 1] if j + 1 < len(starts) else len(rows)
        if a + 1 < b:
            yield rows[a][1] if len(rows[a]) > 1 else "?", rows[a + 1], rows[a + 2:b]


def as_int(s):
    try:
        return int(float(s))
    except (TypeError, ValueError):
        return 0


def summarise(name, header, body, top, out):
    col = {h: i for i, h in enumerate(header)}
    need = ("Address", "Source", "Instructions Executed", "Warp Stall Sampling (All Samples)")
    if any(h not in col for h in need):
        out.write(f"{name}: the page lacks {', '.join(h for h in need if h not in col)}\n")
        return
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    lines, totals = [], Counter()
    base = None
    for r in body:
        if len(r) < len(header):
            continue
        executed = as_int(r[col["Instructions Executed"]])
        samples = as_int(r[col["Warp Stall Sampling (All Samples)"]])
        try:
            addr = int(r[col["Address"]], 16)
        except ValueError:
            addr = 0
        base = addr if base is None else min(base, addr)
        by_reason = Counter({h[6:]: as_int(r[col[h]]) for h in reasons})
        totals.update(by_reason)
        lines.append((addr, r[col["Source"]].strip(), executed, samples, by_reason))
    executed = sum(l[2] for l in lines)
    samples = sum(l[3] for l in lines)
    short = short_name(name)
    out.write(f"== {short}: {executed:,} warp instructions executed, {samples:,} stall samples\n")
    out.write("   by reason: " + ", ".join(f"{k} {v}" for k, v in totals.most_common(8) if v) + "\n")
    for addr, src, ex, sm, by in sorted(lines, key=lambda l: -l[3])[:top]:
        if sm == 0:
            break
        why = " ".join(f"{k}={v}" for k, v in by.most_common(2) if v)
        out.write(f"   +{addr - base:#07x} {ex:>9,} {sm:>5}  {src[:60]:60s} {why}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file", nargs="?", help="the CSV (default: stdin)")
    ap.add_argument("--top", type=int, default=12, help="lines a kernel (default 12)")
    a = ap.parse_args()
    src = open(a.file, newline="") if a.file else sys.stdin
    rows = list(csv.reader(src))
    seen = set()
    for name, header, body in sections(rows):
        key = (name, len(body))  # the page lists a kernel once per profiled launch
        if key in seen:
            continue
        seen.add(key)
        summarise(name, header, body, a.top, sys.stdout)
    if not seen:
        sys.stdout.write("kernel_lines: no kernel in the input (not an ncu source page?)\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
