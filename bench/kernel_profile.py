#!/usr/bin/env python3
"""Where a decode step's GPU time goes: per-kernel totals from an Nsight Compute run.

Reads the CSV that `ncu --csv --page raw --metrics gpu__time_duration.sum` writes (ncu's own
`==PROF==` lines may be mixed in; a units row under the header is skipped) and prints, per
kernel (its name and template arguments, the parameter list cut off), the launches, the total time and
the time per step (the total over --steps, the decode steps of the profiled run), largest first,
then the sum. A run with a short prefill and --steps decode steps gives the decode step's
breakdown up to the prefill's share (shown by --minus, the same run without decode steps, when
given: its totals are subtracted kernel by kernel).

  python3 bench/kernel_profile.py ncu.csv --steps 4 [--minus ncu_prefill_only.csv] [--plus ...] [--top 30] [--by-grid]
"""
import argparse
import csv
import re
import sys
from collections import defaultdict

METRIC = "gpu__time_duration.sum"
UNIT_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}


def short_name(name):
    """The kernel's name with its template arguments, without its parameter list."""
    n = re.sub(r"^(void|static)\s+", "", name.strip())
    depth = 0
    for i, ch in enumerate(n):  # the first '(' outside template brackets opens the parameters
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0 and i > 0:
            return n[:i].strip()
    return n


def read_totals(path, by_grid=False):
    """{kernel: [launches, total ns]} from one ncu CSV file (by_grid: a key per kernel and grid size, which
    tells apart the matrices one GEMV kernel multiplies)."""
    with open(path, newline="", errors="replace") as f:
        lines = [ln for ln in f if not ln.startswith("==")]
    start = next((i for i, ln in enumerate(lines) if "Kernel Name" in ln and METRIC in ln), None)
    if start is None:
        sys.exit(f"{path}: no CSV header with 'Kernel Name' and '{METRIC}' (was ncu run with --csv --page raw "
                 f"--metrics {METRIC}?)")
    rows = list(csv.reader(lines[start:]))
    header = rows[0]
    k_col, m_col = header.index("Kernel Name"), header.index(METRIC)
    g_col = header.index("Grid Size") if by_grid and "Grid Size" in header else None
    scale = 1.0
    totals = defaultdict(lambda: [0, 0.0])
    for row in rows[1:]:
        if len(row) <= max(k_col, m_col):
            continue
        value = row[m_col].replace(",", "").strip()
        try:
            v = float(value)
        except ValueError:  # the units row under the header
            unit = value.lower()
            if unit in UNIT_NS:
                scale = UNIT_NS[unit]
            continue
        key = short_name(row[k_col])
        if g_col is not None and len(row) > g_col:
            key += f" grid {row[g_col].strip()}"
        t = totals[key]
        t[0] += 1
        t[1] += v * scale
    if not totals:
        sys.exit(f"{path}: no kernel rows")
    return totals


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, required=True,
                    help="decode steps in the profiled run (or its prefills, profiling a prefill)")
    ap.add_argument("--minus", action="append", default=[],
                    help="the same run without the steps (or with a short prefill): subtracted kernel by kernel "
                         "(may be given more than once)")
    ap.add_argument("--plus", action="append", default=[],
                    help="a run added kernel by kernel (with two --minus: a difference of two differences, e.g. "
                         "speculative steps less the plain steps the same bench also ran)")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--by-grid", action="store_true", help="a line per kernel and grid size")
    a = ap.parse_args()
    if a.steps < 1:
        sys.exit("--steps must be at least 1")
    totals = read_totals(a.csv, a.by_grid)
    for path, sign in [(p, -1) for p in a.minus] + [(p, 1) for p in a.plus]:
        for k, (n, ns) in read_totals(path, a.by_grid).items():
            t = totals[k]
            t[0] += sign * n
            t[1] += sign * ns
    items = sorted(((k, n, ns) for k, (n, ns) in totals.items() if n > 0 or ns > 0), key=lambda x: -x[2])
    all_ns = sum(ns for _, _, ns in items)
    print(f"| kernel | launches / step | us / step | share |")
    print("|---|---|---|---|")
    for k, n, ns in items[: a.top]:
        print(f"| {k} | {n / a.steps:.1f} | {ns / a.steps / 1e3:.1f} | {100.0 * ns / all_ns:.1f}% |")
    rest = items[a.top:]
    if rest:
        print(f"| ({len(rest)} others) | {sum(n for _, n, _ in rest) / a.steps:.1f} | "
              f"{sum(ns for _, _, ns in rest) / a.steps / 1e3:.1f} | {100.0 * sum(ns for _, _, ns in rest) / all_ns:.1f}% |")
    print(f"RESULT kernel_profile steps={a.steps} kernels_per_step={sum(n for _, n, _ in items) / a.steps:.1f} "
          f"kernel_us_per_step={all_ns / a.steps / 1e3:.1f}")


if __name__ == "__main__":
    main()
