#!/usr/bin/env python3
"""Prefix cache benchmark against `qdelta serve` (default model unless -m is given).

Starts the server twice, prefix cache off and on, and runs on each:
  1. shared system prompt: 32 streaming /v1/completions requests whose prompts are one
     2,000-token system prompt (token ids) plus a distinct 50-token question, sent by
     --concurrency closed-loop clients; reports TTFT p50/p95 and the prefill tokens
     the engine computed (qdelta_prefill_tokens_total) and the cache hits;
  2. chat replay: an 8-turn /v1/chat/completions conversation (each turn resends the
     history plus the model's reply and a new user message); reports per turn TTFT,
     prompt tokens and tokens hit in the prefix cache (from /metrics deltas).

    python3 bench/prefix_bench.py --qdelta build/qdelta [--markdown] [-- extra serve args]

Standard library only."""
import argparse
import http.client
import json
import random
import subprocess
import sys
import threading
import time


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        if line and not line.startswith("#") and "{" not in line:
            k, v = line.split(" ", 1)
            out[k] = float(v)
    c.close()
    return out


def stream(port, path, body):
    """One streaming request: (ttft seconds, text)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    ttft, text, buf = None, [], b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: ") or ev[6:] == b"[DONE]":
                continue
            for ch in json.loads(ev[6:]).get("choices", []):
                delta = ch.get("delta") or {}
                piece = ch.get("text") or delta.get("content") or ""
                # the first generated token may surface as reasoning, or as text held back
                if ttft is None and (piece or delta.get("reasoning_content") or ch.get("logprobs")):
                    ttft = time.perf_counter() - t0
                text.append(piece)
    c.close()
    if ttft is None:  # nothing visible came back (e.g. a dummy model's special tokens): the whole request
        ttft = time.perf_counter() - t0
    return ttft, "".join(text)


def start_server(args, port, cache_bytes):
    cmd = [args.qdelta, "serve", "--port", str(port), "-q", "--prefix-cache-memory", str(cache_bytes)] + args.serve_args
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for _ in range(600):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return p
        except OSError:
            pass
        if p.poll() is not None:
            raise RuntimeError("server exited: " + p.stderr.read().decode()[-2000:])
        time.sleep(0.1)
    raise RuntimeError("server did not come up")


def shared_prompt(args, port):
    rng = random.Random(7)
    system = [rng.randint(100, 7999) for _ in range(args.system_len)]
    bodies = []
    for _ in range(args.requests):
        q = [rng.randint(100, 7999) for _ in range(args.question_len)]
        bodies.append({"prompt": system + q, "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True,
                       "stream": True})
    m0 = metrics(port)
    ttfts, lock, nxt = [], threading.Lock(), [0]

    def client():
        while True:
            with lock:
                if nxt[0] >= len(bodies):
                    return
                i = nxt[0]
                nxt[0] += 1
            t, _ = stream(port, "/v1/completions", bodies[i])
            with lock:
                ttfts.append(t)
    t0 = time.perf_counter()
    ts = [threading.Thread(target=client) for _ in range(args.concurrency)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dur = time.perf_counter() - t0
    m1 = metrics(port)
    d = {k: m1.get(k, 0) - m0.get(k, 0) for k in m1}
    return {"ttft_p50_ms": 1e3 * pct(ttfts, 50), "ttft_p95_ms": 1e3 * pct(ttfts, 95), "duration_s": dur,
            "prefill_tokens": int(d.get("qdelta_prefill_tokens_total", 0)),
            "prompt_tokens": args.requests * (args.system_len + args.question_len),
            "hit_tokens": int(d.get("qdelta_prefix_cache_hit_tokens_total", 0)),
            "snapshots": int(m1.get("qdelta_prefix_cache_snapshots", 0)),
            "cache_bytes": int(m1.get("qdelta_prefix_cache_bytes", 0))}


def chat_replay(args, port):
    rng = random.Random(11)
    words = ["alpha", "river", "compute", "state", "delta", "token", "garden", "signal", "orbit", "paper", "lamp",
             "stone", "cloud", "matrix", "harbor", "violet"]
    system = " ".join(rng.choice(words) for _ in range(300))
    msgs = [{"role": "system", "content": system}]
    turns = []
    for k in range(args.turns):
        msgs.append({"role": "user", "content": " ".join(rng.choice(words) for _ in range(30))})
        m0 = metrics(port)
        t, reply = stream(port, "/v1/chat/completions", {"messages": msgs, "max_tokens": args.max_tokens,
                                                         "temperature": 0, "stream": True})
        m1 = metrics(port)
        d = {k2: m1.get(k2, 0) - m0.get(k2, 0) for k2 in m1}
        turns.append({"turn": k + 1, "ttft_ms": 1e3 * t, "prompt_tokens": int(d.get("qdelta_prompt_tokens_total", 0)),
                      "prefill_tokens": int(d.get("qdelta_prefill_tokens_total", 0)),
                      "hit_tokens": int(d.get("qdelta_prefix_cache_hit_tokens_total", 0))})
        msgs.append({"role": "assistant", "content": reply})
    return turns


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qdelta", default="build/qdelta")
    ap.add_argument("--port", type=int, default=18471)
    ap.add_argument("--cache-bytes", type=int, default=1 << 30)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--system-len", type=int, default=2000)
    ap.add_argument("--question-len", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("serve_args", nargs="*", help="extra `qdelta serve` arguments (after --)")
    args = ap.parse_args()
    res = {}
    for name, cache in (("off", 0), ("on", args.cache_bytes)):
        p = start_server(args, args.port, cache)
        try:
            res[name] = {"shared": shared_prompt(args, args.port), "chat": chat_replay(args, args.port)}
        finally:
            p.terminate()
            p.wait(timeout=60)
        print(name, json.dumps(res[name]), flush=True)
    if args.markdown:
        print(f"\n{args.requests} requests, {args.system_len}-token shared system prompt + {args.question_len}-token "
              f"question, {args.max_tokens} output tokens, {args.concurrency} closed-loop clients\n")
        print("| prefix cache | TTFT p50 (ms) | TTFT p95 (ms) | prefill tokens computed | hit tokens | wall (s) |")
        print("|---|---:|---:|---:|---:|---:|")
        for name in ("off", "on"):
            s = res[name]["shared"]
            print(f"| {name} | {s['ttft_p50_ms']:.0f} | {s['ttft_p95_ms']:.0f} | {s['prefill_tokens']} of "
                  f"{s['prompt_tokens']} | {s['hit_tokens']} | {s['duration_s']:.1f} |")
        print(f"\n{args.turns}-turn chat replay (/v1/chat/completions, 300-word system message, 30-word user turns)\n")
        print("| turn | prompt tokens | hit (on) | prefill computed off / on | TTFT off / on (ms) |")
        print("|---:|---:|---:|---|---|")
        for a, b in zip(res["off"]["chat"], res["on"]["chat"]):
            print(f"| {a['turn']} | {b['prompt_tokens']} | {b['hit_tokens']} | {a['prefill_tokens']} / "
                  f"{b['prefill_tokens']} | {a['ttft_ms']:.0f} / {b['ttft_ms']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
