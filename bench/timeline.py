#!/usr/bin/env python3
"""One forward's kernels on the GPU's clock, from a timeline build's qdelta-timeline.txt.

A build configured with -DQD_CUDA_TIMELINE=ON (src/backend/cuda/cuda_timeline.h) writes the file
after its 32nd forward: `L capture name gx gy gz` for every launch captured into a CUDA graph, in
capture order, and `T grid t_wait t_release blocks sm block` for the first 128 blocks of every grid
that waited through qd_pdl_wait in the recorded forward (nanoseconds of the global timer at the
block's wait and at its release). The grids, ordered by their first release, are paired with the
captured launches of the graph whose grid sizes match best, and for each kernel this prints:

  dur     its first release to the next kernel's first release: its share of the critical path
  pre     how long its first block waited before the release: what its pre-wait loads could overlap
  late    how long after the previous kernel's release its first block reached its wait (negative:
          before), that is how early its blocks were resident
  spread  its last recorded block's release after its first (blocks that arrived after the release)

then the same per kernel name (and grid), summed and averaged over the forward.

  python3 bench/timeline.py qdelta-timeline.txt [--rows 60]
"""
import argparse
import re
import subprocess
from collections import defaultdict


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
        return out.stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return list(names)


def read(path):
    captures, grids = defaultdict(list), defaultdict(list)
    with open(path) as f:
        for line in f:
            p = line.split()
            if not p or p[0] == "#":
                continue
            if p[0] == "L":
                captures[int(p[1])].append((p[2], int(p[3]) * int(p[4]) * int(p[5]), int(p[3])))
            elif p[0] == "T":
                grid, t_wait, t_release, blocks, _sm, _block = map(int, p[1:7])
                grids[grid].append((t_wait, t_release, blocks))
    rows = []
    for rs in grids.values():
        rows.append({"wait": min(r[0] for r in rs), "rel": min(r[1] for r in rs),
                     "rel_last": max(r[1] for r in rs), "blocks": rs[0][2]})
    rows.sort(key=lambda g: g["rel"])
    return list(captures.values()), rows


def match(launches, grids):
    """The captured run and offset whose grid sizes agree with the recorded grids most often."""
    best = (-1, [], 0)
    for run in launches:
        for off in range(max(1, len(grids) - len(run) + 1)):
            n = sum(1 for i, g in enumerate(grids[off:off + len(run)]) if run[i][1] == g["blocks"])
            if n > best[0]:
                best = (n, run, off)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--rows", type=int, default=60, help="kernels listed one by one (then the totals)")
    a = ap.parse_args()
    launches, grids = read(a.file)
    if not grids:
        raise SystemExit(f"{a.file}: no block records (was the recorded forward a graph of PDL kernels?)")
    hits, run, off = match(launches, grids)
    names = demangle([r[0] for r in run])
    print(f"{len(grids)} grids recorded; captured graphs of {[len(r) for r in launches]} launches; "
          f"{hits} of {len(run)} grid sizes agree at offset {off}")
    t0 = grids[0]["rel"]
    per = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    for i, g in enumerate(grids):
        name = "?"
        if off <= i < off + len(run):
            name = re.sub(r"\(.*", "", names[i - off])[:48] + f" @{run[i - off][2]}"
        dur = (grids[i + 1]["rel"] - g["rel"]) / 1e3 if i + 1 < len(grids) else 0.0
        pre = (g["rel"] - g["wait"]) / 1e3
        late = (g["wait"] - grids[i - 1]["rel"]) / 1e3 if i else 0.0
        spread = (g["rel_last"] - g["rel"]) / 1e3
        if i < a.rows:
            print(f"{i:4d} {name:54s} blocks {g['blocks']:5d}  at {(g['rel'] - t0) / 1e3:9.2f}  dur {dur:7.2f}  "
                  f"pre {pre:6.2f}  late {late:7.2f}  spread {spread:5.2f}")
        s = per[name]
        s[0] += 1
        s[1] += dur
        s[2] += pre
        s[3] += late
        s[4] += spread
    print("per kernel, us (largest total first; the last kernel's dur is not known)")
    for name, s in sorted(per.items(), key=lambda kv: -kv[1][1]):
        n = s[0]
        print(f"{name:54s} n {n:4d}  total {s[1]:8.1f}  dur {s[1] / n:6.2f}  pre {s[2] / n:6.2f}  "
              f"late {s[3] / n:7.2f}  spread {s[4] / n:5.2f}")
    print(f"first release to last: {(grids[-1]['rel'] - t0) / 1e3:.1f} us")


if __name__ == "__main__":
    main()
