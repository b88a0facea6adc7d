#!/usr/bin/env python3
"""Prefix cache benchmark against `qdelta serve` (default model unless -m is given).

Starts the server with the prefix cache off, on (--cache-bytes of device-tier memory:
GPU memory with --backend cuda), and, with --tier-bytes, on with a small device tier
over a host-memory tier (--host-bytes), and runs on each:
  1. shared system prompt: 32 streaming /v1/completions requests whose prompts are one
     2,000-token system prompt (token ids) plus a distinct 50-token question, sent by
     --concurrency closed-loop clients; reports TTFT p50/p95 and the prefill tokens
     the engine computed (qdelta_prefill_tokens_total) and the cache hits;
  2. chat replay: an 8-turn /v1/chat/completions conversation (each turn resends the
     history plus the model's reply and a new user message); reports per turn TTFT,
     prompt tokens and tokens hit in the prefix cache (from /metrics deltas).
Every request must come back whole: an error event, a non-200 answer or fewer tokens
than asked for (usage.completion_tokens) is counted, reported, and makes the exit
status 1 (numbers from failing requests are not measurements: a failed step ends its
requests early, which shortens TTFT and the prefill count).

    python3 bench/prefix_bench.py --qdelta build/qdelta [--markdown] [-- extra serve args]

Prints one JSON line per configuration, `RESULT prefix_...` lines (key=value, for
scripts/gpu-check.sh's summary) and with --markdown the tables. Standard library only."""
import argparse
import http.client
import json
import random
import subprocess
import sys
import threading
import time

from sse import sse_events


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def mib(n):
    return f"{n / 2**20:.3g} MiB"


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
    """One streaming request: (ttft seconds, text, completion tokens, error or None)."""
    body = dict(body, stream_options={"include_usage": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        err = f"HTTP {r.status}: {r.read()[:300]!r}"
        c.close()
        return time.perf_counter() - t0, "", 0, err
    ttft, text, ntok, err = None, [], 0, None
    for obj in sse_events(r):
        if "error" in obj:
            err = str(obj["error"].get("message", obj["error"]))[:300]
        if obj.get("usage"):
            ntok = obj["usage"].get("completion_tokens", 0)
        for ch in obj.get("choices", []):
            delta = ch.get("delta") or {}
            piece = ch.get("text") or delta.get("content") or ""
            # the first generated token may surface as reasoning, or as text held back
            if ttft is None and (piece or delta.get("reasoning_content") or ch.get("logprobs")):
                ttft = time.perf_counter() - t0
            text.append(piece)
    c.close()
    if ttft is None:  # nothing visible came back (e.g. a dummy model's special tokens): the whole request
        ttft = time.perf_counter() - t0
    return ttft, "".join(text), ntok, err


def start_server(args, port, cache_bytes, host_bytes=0):
    cmd = [args.qdelta, "serve", "--port", str(port), "-q", "--prefix-cache-memory", str(cache_bytes)]
    if host_bytes:
        cmd += ["--prefix-cache-host-memory", str(host_bytes)]
    cmd += args.serve_args
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
    ttfts, lock, nxt, errors = [], threading.Lock(), [0], []

    def client():
        while True:
            with lock:
                if nxt[0] >= len(bodies):
                    return
                i = nxt[0]
                nxt[0] += 1
            t, _, ntok, err = stream(port, "/v1/completions", bodies[i])
            with lock:
                ttfts.append(t)
                if err or ntok != args.max_tokens:
                    errors.append(err or f"{ntok} of {args.max_tokens} tokens")
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
            "host_snapshots": int(m1.get("qdelta_prefix_cache_host_snapshots", 0)),
            "spills": int(d.get("qdelta_prefix_cache_spills_total", 0)),
            "host_restores": int(d.get("qdelta_prefix_cache_host_restores_total", 0)),
            "cache_bytes": int(m1.get("qdelta_prefix_cache_bytes", 0)),
            "errors": len(errors), "first_error": errors[0] if errors else ""}


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
        t, reply, ntok, err = stream(port, "/v1/chat/completions", {"messages": msgs, "max_tokens": args.max_tokens,
                                                                    "temperature": 0, "stream": True})
        m1 = metrics(port)
        d = {k2: m1.get(k2, 0) - m0.get(k2, 0) for k2 in m1}
        turns.append({"turn": k + 1, "ttft_ms": 1e3 * t, "prompt_tokens": int(d.get("qdelta_prompt_tokens_total", 0)),
                      "prefill_tokens": int(d.get("qdelta_prefill_tokens_total", 0)),
                      "hit_tokens": int(d.get("qdelta_prefix_cache_hit_tokens_total", 0)),
                      "host_restores": int(d.get("qdelta_prefix_cache_host_restores_total", 0)),
                      "error": err or ("" if ntok >= 1 else "no tokens")})
        msgs.append({"role": "assistant", "content": reply})
    return turns


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qdelta", default="build/qdelta")
    ap.add_argument("--port", type=int, default=18471)
    ap.add_argument("--cache-bytes", type=int, default=1 << 30, help="device tier of the 'on' run")
    ap.add_argument("--tier-bytes", type=int, default=0,
                    help="device tier of a third run 'tiered' over a host tier (0: no such run)")
    ap.add_argument("--host-bytes", type=int, default=4 << 30, help="host tier of the 'tiered' run")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--system-len", type=int, default=2000)
    ap.add_argument("--question-len", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("serve_args", nargs="*", help="extra `qdelta serve` arguments (after --)")
    args = ap.parse_args()
    configs = [("off", 0, 0), ("on", args.cache_bytes, 0)]
    if args.tier_bytes:
        configs.append(("tiered", args.tier_bytes, args.host_bytes))
    res, failed = {}, 0
    for name, cache, host in configs:
        p = start_server(args, args.port, cache, host)
        try:
            res[name] = {"shared": shared_prompt(args, args.port), "chat": chat_replay(args, args.port)}
        finally:
            p.terminate()
            p.wait(timeout=60)
        print(name, json.dumps(res[name]), flush=True)
        s = res[name]["shared"]
        chat_errors = [t for t in res[name]["chat"] if t["error"]]
        failed += s["errors"] + len(chat_errors)
        print(f"RESULT prefix_shared cache={name} device_bytes={cache} host_bytes={host} "
              f"ttft_p50_ms={s['ttft_p50_ms']:.1f} ttft_p95_ms={s['ttft_p95_ms']:.1f} "
              f"prefill={s['prefill_tokens']} prompt={s['prompt_tokens']} hit={s['hit_tokens']} "
              f"spills={s['spills']} host_restores={s['host_restores']} errors={s['errors']}", flush=True)
        hits = ",".join(str(t["hit_tokens"]) for t in res[name]["chat"])
        prompts = ",".join(str(t["prompt_tokens"]) for t in res[name]["chat"])
        ttfts = ",".join(f"{t['ttft_ms']:.0f}" for t in res[name]["chat"])
        print(f"RESULT prefix_chat cache={name} hits={hits} prompts={prompts} ttft_ms={ttfts} "
              f"errors={len(chat_errors)}", flush=True)
        if s["errors"]:
            print(f"ERROR {name}: {s['errors']} shared-prompt requests failed, first: {s['first_error']}", flush=True)
        for t in chat_errors:
            print(f"ERROR {name}: chat turn {t['turn']}: {t['error']}", flush=True)
    if args.markdown:
        names = [c[0] for c in configs]
        print(f"\n{args.requests} requests, {args.system_len}-token shared system prompt + {args.question_len}-token "
              f"question, {args.max_tokens} output tokens, {args.concurrency} closed-loop clients\n")
        print("| prefix cache | TTFT p50 (ms) | TTFT p95 (ms) | prefill tokens computed | hit tokens | spills / host "
              "restores | failed requests | wall (s) |")
        print("|---|---:|---:|---:|---:|---|---:|---:|")
        for name, cache, host in configs:
            s = res[name]["shared"]
            label = name if not cache else f"{name} ({mib(cache)}" + (f" + {mib(host)} host)" if host else ")")
            print(f"| {label} | {s['ttft_p50_ms']:.0f} | {s['ttft_p95_ms']:.0f} | {s['prefill_tokens']} of "
                  f"{s['prompt_tokens']} | {s['hit_tokens']} | {s['spills']} / {s['host_restores']} | {s['errors']} | "
                  f"{s['duration_s']:.1f} |")
        print(f"\n{args.turns}-turn chat replay (/v1/chat/completions, 300-word system message, 30-word user turns)\n")
        print("| turn | prompt tokens | " + " | ".join(f"hit ({n})" for n in names[1:]) + " | prefill computed " +
              " / ".join(names) + " | TTFT " + " / ".join(names) + " (ms) |")
        print("|---:|---:|" + "---:|" * (len(names) - 1) + "---|---|")
        for k in range(args.turns):
            row = [res[n]["chat"][k] for n in names]
            print(f"| {k + 1} | {row[-1]['prompt_tokens']} | " + " | ".join(str(t["hit_tokens"]) for t in row[1:]) +
                  " | " + " / ".join(str(t["prefill_tokens"]) for t in row) + " | " +
                  " / ".join(f"{t['ttft_ms']:.0f}" for t in row) + " |")
    if failed:
        print(f"prefix_bench: {failed} requests failed: the numbers above are not measurements", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
