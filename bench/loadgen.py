#!/usr/bin/env python3
"""Closed-loop load generator for an OpenAI-compatible server (qdelta serve, vLLM, ...).

For each concurrency level C, C clients each send streaming /v1/completions requests
back to back (a new one as soon as the previous finishes) until the level's request
count is reached. Every request has a fixed input length (a prompt of token ids) and
a fixed output length (max_tokens with ignore_eos), so levels are comparable.

Reported per level: request throughput, output and total token throughput, TTFT
(request sent -> first token), inter-token latency (gaps between tokens of one
request) and end-to-end latency, each as p50/p95/p99. Tokens are counted from the
per-token logprobs the stream carries, so a chunk that carries several tokens (text
held back by the detokenizer) is split evenly over them.

    python3 bench/loadgen.py --url http://127.0.0.1:8000 --concurrency 1,8,64 \
        --input-len 128 --output-len 64 [--requests 64] [--api-key KEY] [--markdown]

Standard library only. Prompt ids are drawn from --id-range (default 100..7999, inside
the default model's vocabulary; pass the range of the model you load)."""
import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def one_request(host, port, headers, body, timeout):
    """Sends one streaming request; returns (ttft, [itl...], e2e, n_tokens, prompt_tokens)."""
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=body, headers=headers)
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    ttft, last, itl, n_tok, usage = None, None, [], 0, None
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(4096)
        if not chunk:
            break
        now = time.perf_counter()
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: "):
                continue
            data = ev[6:]
            if data == b"[DONE]":
                continue
            j = json.loads(data)
            if j.get("error"):  # a failure after the 200 (e.g. the forward pass): an error, not 0 tokens
                raise RuntimeError(f"error event in the stream after {n_tok} tokens: {str(j['error'])[:200]}")
            if j.get("usage"):
                usage = j["usage"]
            for ch in j.get("choices", []):
                lp = ch.get("logprobs") or {}
                k = len(lp.get("tokens") or []) or (1 if ch.get("text") else 0)
                if not k:
                    continue
                if ttft is None:
                    ttft = now - t0
                    k_rest = k - 1
                else:
                    gap = (now - last) / k
                    itl.extend([gap] * k)
                    k_rest = 0
                if k_rest:
                    itl.extend([0.0] * k_rest)
                last = now
                n_tok += k
    e2e = time.perf_counter() - t0
    c.close()
    return ttft, itl, e2e, n_tok, (usage or {}).get("prompt_tokens", 0)


def run_level(args, conc, n_requests):
    u = urllib.parse.urlparse(args.url)
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = "Bearer " + args.api_key
    rng = random.Random(1234 + conc)
    lo, hi = (int(x) for x in args.id_range.split(".."))
    bodies = []
    for i in range(n_requests):
        ids = [rng.randint(lo, hi) for _ in range(args.input_len)]
        bodies.append(json.dumps({"model": args.model, "prompt": ids, "max_tokens": args.output_len,
                                  "temperature": args.temperature, "ignore_eos": True, "stream": True,
                                  "logprobs": 0, "stream_options": {"include_usage": True}}))
    nxt = [0]
    lock = threading.Lock()
    res, errors = [], []

    def client():
        while True:
            with lock:
                if nxt[0] >= n_requests:
                    return
                i = nxt[0]
                nxt[0] += 1
            try:
                out = one_request(u.hostname, u.port, headers, bodies[i], args.timeout)
                with lock:
                    res.append(out)
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(str(e))
    t0 = time.perf_counter()
    ts = [threading.Thread(target=client) for _ in range(conc)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dur = time.perf_counter() - t0
    ttft = [r[0] for r in res if r[0] is not None]
    itl = [x for r in res for x in r[1]]
    e2e = [r[2] for r in res]
    # TPOT as vLLM's and guidellm's reports define it: a request's time after its first
    # token over its other tokens, averaged over requests
    tpot = [(r[2] - r[0]) / (r[3] - 1) for r in res if r[0] is not None and r[3] > 1]
    out_tok = sum(r[3] for r in res)
    in_tok = sum(r[4] for r in res)
    return {
        "concurrency": conc, "requests": len(res), "errors": len(errors), "duration_s": dur,
        "req_per_s": len(res) / dur, "output_tok_per_s": out_tok / dur, "total_tok_per_s": (out_tok + in_tok) / dur,
        "ttft_ms": [1e3 * pct(ttft, p) for p in (50, 95, 99)],
        "itl_ms": [1e3 * pct(itl, p) for p in (50, 95, 99)],
        "ttft_mean_ms": 1e3 * sum(ttft) / len(ttft) if ttft else float("nan"),
        "tpot_mean_ms": 1e3 * sum(tpot) / len(tpot) if tpot else float("nan"),
        "e2e_s": [pct(e2e, p) for p in (50, 95, 99)],
        "first_error": errors[0] if errors else None,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--model", default=None, help="model id (default: the first of /v1/models)")
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default max(8, 4 x concurrency))")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--id-range", default="100..7999")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    ap.add_argument("--json", default="", help="also write the results to this file")
    args = ap.parse_args()
    if not args.model:
        u = urllib.parse.urlparse(args.url)
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        c.request("GET", "/v1/models", headers={"Authorization": "Bearer " + args.api_key} if args.api_key else {})
        args.model = json.loads(c.getresponse().read())["data"][0]["id"]
        c.close()
    if args.warmup:
        run_level(args, 1, args.warmup)
    results = []
    for conc in (int(x) for x in args.concurrency.split(",")):
        n = args.requests or max(8, 4 * conc)
        r = run_level(args, conc, n)
        results.append(r)
        print(f"C={conc:3d}  {r['requests']} req ({r['errors']} errors) in {r['duration_s']:.1f}s  "
              f"{r['req_per_s']:.2f} req/s  {r['output_tok_per_s']:.1f} out tok/s  {r['total_tok_per_s']:.1f} total tok/s  "
              f"TTFT ms p50/p95/p99 {r['ttft_ms'][0]:.1f}/{r['ttft_ms'][1]:.1f}/{r['ttft_ms'][2]:.1f}  "
              f"ITL ms {r['itl_ms'][0]:.2f}/{r['itl_ms'][1]:.2f}/{r['itl_ms'][2]:.2f}  "
              f"mean TTFT {r['ttft_mean_ms']:.1f} ms TPOT {r['tpot_mean_ms']:.2f} ms  "
              f"E2E s {r['e2e_s'][0]:.2f}/{r['e2e_s'][1]:.2f}/{r['e2e_s'][2]:.2f}", flush=True)
        if r["first_error"]:
            print("  first error:", r["first_error"], file=sys.stderr)
    if args.markdown:
        print(f"\ninput {args.input_len} tokens, output {args.output_len} tokens, temperature {args.temperature}, "
              f"closed loop\n")
        print("| concurrency | requests | req/s | output tok/s | total tok/s | TTFT p50 / p95 / p99 (ms) | "
              "ITL p50 / p95 / p99 (ms) | mean TTFT / TPOT (ms) | E2E p50 / p95 / p99 (s) |")
        print("|---:|---:|---:|---:|---:|---|---|---|---|")
        for r in results:
            print(f"| {r['concurrency']} | {r['requests']} | {r['req_per_s']:.2f} | {r['output_tok_per_s']:.1f} | "
                  f"{r['total_tok_per_s']:.1f} | {r['ttft_ms'][0]:.1f} / {r['ttft_ms'][1]:.1f} / {r['ttft_ms'][2]:.1f} | "
                  f"{r['itl_ms'][0]:.2f} / {r['itl_ms'][1]:.2f} / {r['itl_ms'][2]:.2f} | "
                  f"{r['ttft_mean_ms']:.1f} / {r['tpot_mean_ms']:.2f} | "
                  f"{r['e2e_s'][0]:.2f} / {r['e2e_s'][1]:.2f} / {r['e2e_s'][2]:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    return 1 if any(r["errors"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
