#!/usr/bin/env python3
"""Checks the layering of src/ (docs/architecture.md):

1. The folders form no include circle. A node is a folder of src/, except that
   backend/<name> and parallel/<name> are nodes of their own (backend/cpu,
   backend/cuda, parallel/cuda); a file includes a node when it includes a header
   under it ("model/model.h").
2. src/model, src/runtime, src/server and src/cli hold no backend conditionals: no
   QD_HAVE_CUDA / QD_HAVE_NCCL, no test of the backend kind, no header of a backend
   folder (they reach backends through backend/backend.h alone).

Prints the graph and every violation; exits 1 when there is one."""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
SPLIT = ("backend", "parallel")  # folders whose subfolders are nodes of their own
CALLERS = ("model", "runtime", "server", "cli")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
CONDITIONAL = re.compile(r"QD_HAVE_(CUDA|NCCL)|QD_BACKEND_CUDA|==\s*QD_BACKEND_CPU|backend\s*==|->cuda\b|->tp\b")


def node_of(rel):
    parts = rel.split("/")
    if len(parts) >= 3 and parts[0] in SPLIT:
        return parts[0] + "/" + parts[1]
    return parts[0] if len(parts) > 1 else None


def main():
    edges, problems = {}, []
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if not f.endswith((".c", ".h", ".cu", ".cuh")):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
            src = node_of(rel)
            text = open(path, encoding="utf-8").read()
            for inc in INCLUDE.findall(text):
                dst = node_of(inc)
                if dst and src and dst != src:
                    edges.setdefault(src, set()).add(dst)
                    if src in CALLERS and (dst.startswith("backend/") or dst.startswith("parallel/")):
                        problems.append(f"{rel} includes {inc}: {src} reaches backends through backend/backend.h")
            if src in CALLERS:
                for lineno, line in enumerate(text.splitlines(), 1):
                    if CONDITIONAL.search(line):
                        problems.append(f"{rel}:{lineno}: backend conditional: {line.strip()}")
    # cycles: depth-first search over the node graph
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                problems.append("include circle: " + " -> ".join(stack[stack.index(m):] + [m]))
            elif not state.get(m):
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(edges):
        if not state.get(n):
            visit(n)
    for n in sorted(edges):
        print(f"{n:16} -> {', '.join(sorted(edges[n]))}")
    for p in problems:
        print("FAIL:", p)
    print(f"check_layers: {0 if problems else 1} passed, {len(problems)} failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
