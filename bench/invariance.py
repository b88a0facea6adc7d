#!/usr/bin/env python3
"""Batch invariance through the server: greedy outputs of N concurrent requests of
different prompt lengths and max_tokens must be the same token ids as each request
run alone (issue #5; on the CPU also checked by tests/test_server.py, here for any
backend, in particular `qdelta serve --backend cuda`).

    python3 bench/invariance.py --url http://127.0.0.1:8000 [--requests 24] [--id-range 100..7999]
    python3 bench/invariance.py --qdelta build/qdelta [--port 0] -- -m DIR --backend cuda ...

With --qdelta it starts `qdelta serve` with the arguments after `--` (and
--max-num-seqs >= requests unless given) and stops it at the end.

Requests are /v1/completions with prompts of token ids drawn from --id-range, temperature
0, ignore_eos, `logprobs: 0` by default (as bench/loadgen.py sends them: the engine then
takes each token from the forward's argmax, never sending a logits row through the
sampler) and vLLM's `return_tokens_as_token_ids`, so the ids come back exactly. Each is
sent alone (non-streaming, one after the other), then all at once (streaming, started
together). Every request must return exactly max_tokens ids with finish_reason
"length", and the two runs must agree id for id. --top-logprobs 2 sends the requests
through the sampler instead and reports the top-2 margin where runs part (a near tie
that rounding can flip).

Last line: RESULT invariance requests=N identical=K ... ok=0|1 (exit status 0 iff ok).
Standard library only."""
import argparse
import http.client
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

from sse import sse_events


def post(host, port, headers, body, timeout):
    """One /v1/completions request: (ids, logprobs, margins, finish_reason, error)."""
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body), headers=headers)
        r = c.getresponse()
        if r.status != 200:
            return [], [], [], None, f"HTTP {r.status}: {r.read()[:300]!r}"
        ids, lps, margins, finish, err = [], [], [], None, None

        def take(j):
            nonlocal finish, err
            if "error" in j:
                err = str(j["error"])[:300]
            for ch in j.get("choices", []):
                lp = ch.get("logprobs") or {}
                for t in lp.get("tokens") or []:
                    ids.append(int(t.split(":", 1)[1]) if t.startswith("token_id:") else -1)
                lps.extend(lp.get("token_logprobs") or [])
                for top in lp.get("top_logprobs") or []:
                    v = sorted((top or {}).values(), reverse=True)
                    margins.append(v[0] - v[1] if len(v) >= 2 else None)
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
        if not body.get("stream"):
            take(json.loads(r.read()))
        else:
            for obj in sse_events(r):
                take(obj)
        return ids, lps, margins, finish, err
    except (OSError, ValueError, http.client.HTTPException) as e:
        return [], [], [], None, f"{type(e).__name__}: {e}"
    finally:
        c.close()


def start_server(qdelta, port, serve_args, n):
    args = list(serve_args)
    if "--max-num-seqs" not in args:
        args += ["--max-num-seqs", str(max(n, 8))]
    cmd = [qdelta, "serve", "--port", str(port), "-q"] + args
    print("starting:", " ".join(cmd), flush=True)
    err = tempfile.TemporaryFile(mode="w+")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    # the server prints "listening on http://HOST:PORT" once it accepts connections
    for line in p.stdout:
        if line.startswith("listening on "):
            threading.Thread(target=p.stdout.read, daemon=True).start()  # keep the pipe drained
            return p, int(line.rsplit(":", 1)[1])
    p.wait()
    err.seek(0)
    raise RuntimeError(f"server exited ({p.returncode}) before listening: " + err.read()[-2000:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="", help="a running server (else --qdelta starts one)")
    ap.add_argument("--qdelta", default="", help="qdelta binary: start `qdelta serve` with the arguments after --")
    ap.add_argument("--port", type=int, default=0, help="with --qdelta (0: any free port)")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--id-range", default="100..7999")
    ap.add_argument("--prompt-len", default="1..600", help="prompt lengths, spread over this range")
    ap.add_argument("--max-tokens", default="8..64", help="max_tokens, spread over this range")
    ap.add_argument("--top-logprobs", type=int, default=0, help="0: the argmax path; >= 2: the sampler, with margins")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--label", default="", help="a name for the RESULT line (e.g. the model)")
    ap.add_argument("serve_args", nargs=argparse.REMAINDER, help="-- then `qdelta serve` arguments")
    args = ap.parse_args()
    serve_args = args.serve_args[1:] if args.serve_args[:1] == ["--"] else args.serve_args
    n = args.requests
    proc = None
    if args.qdelta:
        proc, port = start_server(args.qdelta, args.port, serve_args, n)
        host = "127.0.0.1"
    elif args.url:
        u = urllib.parse.urlparse(args.url)
        host, port = u.hostname, u.port
    else:
        ap.error("give --url or --qdelta")
    try:
        return run(args, host, port, n)
    finally:
        if proc:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def spread(spec, n, rng):
    lo, hi = (int(x) for x in spec.split(".."))
    # evenly over the range (so lengths differ), shuffled so that long prompts do not all come last
    vals = [lo + (hi - lo) * i // max(n - 1, 1) for i in range(n)]
    rng.shuffle(vals)
    return vals


def run(args, host, port, n):
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = "Bearer " + args.api_key
    rng = random.Random(args.seed)
    lo, hi = (int(x) for x in args.id_range.split(".."))
    plens, outs = spread(args.prompt_len, n, rng), spread(args.max_tokens, n, rng)
    bodies = [{"prompt": [rng.randint(lo, hi) for _ in range(plens[i])], "max_tokens": outs[i], "temperature": 0,
               "ignore_eos": True, "logprobs": args.top_logprobs, "return_tokens_as_token_ids": True}
              for i in range(n)]

    t0 = time.time()
    alone = [post(host, port, headers, b, args.timeout) for b in bodies]
    t_alone = time.time() - t0
    together = [None] * n
    gate = threading.Barrier(n)

    def client(i):
        gate.wait()
        together[i] = post(host, port, headers, dict(bodies[i], stream=True), args.timeout)
    ts = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    t_together = time.time() - t0

    complete = identical = ties = 0
    for i in range(n):
        want = outs[i]
        runs = (("alone", alone[i]), ("together", together[i]))
        ok = True
        for name, (ids, _, _, finish, err) in runs:
            if err or len(ids) != want or finish != "length" or min(ids, default=0) < 0:
                ok = False
                print(f"request {i} ({plens[i]} prompt tokens, max_tokens {want}) {name}: {len(ids)} ids, "
                      f"finish {finish}, error {err}", flush=True)
        complete += ok
        a, b = alone[i][0], together[i][0]
        if a == b and ok:
            identical += 1
            continue
        if not a or not b:
            continue
        k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
        if k == min(len(a), len(b)):
            continue
        lp = (alone[i][1][k] if k < len(alone[i][1]) else None, together[i][1][k] if k < len(together[i][1]) else None)
        mg = (alone[i][2][k] if k < len(alone[i][2]) else None, together[i][2][k] if k < len(together[i][2]) else None)
        near = all(m is not None and m < 1e-2 for m in mg)
        ties += near
        print(f"request {i} ({plens[i]} prompt tokens): first difference at token {k}: alone {a[k]} "
              f"(logprob {lp[0]}), together {b[k]} (logprob {lp[1]}); top-2 margins {mg}"
              f"{' (near tie)' if near else ''}", flush=True)
    ok = identical == n
    label = f" model={args.label}" if args.label else ""
    print(f"RESULT invariance requests={n} identical={identical} complete={complete} near_ties={ties} "
          f"prompt_len={args.prompt_len} max_tokens={args.max_tokens} top_logprobs={args.top_logprobs} "
          f"tokens={sum(outs)} alone_s={t_alone:.1f} together_s={t_together:.1f}{label} ok={int(ok)}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
