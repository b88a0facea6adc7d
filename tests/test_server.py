#!/usr/bin/env python3
"""End-to-end tests of `qdelta serve` through the official `openai` client (and raw
HTTP where the client cannot express the case: malformed JSON, disconnects, metrics).

Run by tests/cli_server.sh, which starts the servers:
  --url URL --api-key KEY    the default model, with an API key, small context
  --tools-url URL            the default model with a Qwen3.5 chat template (renders
                             tools, opens <think>), no key
  --pid PID                  the first server's pid (RSS during the soak)
Every request has a timeout and every loop a bound; the script exits nonzero on the
first failed check. Missing `openai` module = failure, not a skip."""
import argparse
import http.client
import json
import os
import re
import socket
import sys
import threading
import time
import urllib.parse

try:
    import openai
except ImportError:
    print("FAIL: the python `openai` module is missing (python3 -m pip install openai)", file=sys.stderr)
    sys.exit(1)

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--api-key", required=True)
ap.add_argument("--tools-url", required=True)
ap.add_argument("--pid", type=int, default=0)
ap.add_argument("--soak", type=int, default=2000)
ap.add_argument("--soak-rss-check", type=int, default=1)
ap.add_argument("--only", default="")
args = ap.parse_args()

U = urllib.parse.urlparse(args.url)
client = openai.OpenAI(base_url=args.url + "/v1", api_key=args.api_key, max_retries=0, timeout=120)
tclient = openai.OpenAI(base_url=args.tools_url + "/v1", api_key="unused", max_retries=0, timeout=120)
MODEL = client.models.list().data[0].id
MAX_LEN = 512  # cli_server.sh starts the server with --max-model-len 512
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr, flush=True)
    return cond


def raw(method, path, body=None, headers=None, host=None, port=None, timeout=60):
    """One HTTP request; returns (status, body text)."""
    c = http.client.HTTPConnection(host or U.hostname, port or U.port, timeout=timeout)
    h = {"Authorization": "Bearer " + args.api_key, "Content-Type": "application/json"}
    h.update(headers or {})
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    return r.status, text


def metrics():
    st, text = raw("GET", "/metrics")
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:]+(?:\{[^}]*\})?) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def chat(msg, **kw):
    kw.setdefault("max_tokens", 16)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": msg}], **kw)


def stream_text(resp):
    text, finish, usage, n = "", None, None, 0
    for ch in resp:
        n += 1
        if ch.usage:
            usage = ch.usage
        for c in ch.choices:
            d = getattr(c, "delta", None)
            if d is not None:
                text += d.content or ""
            else:
                text += c.text or ""
            if c.finish_reason:
                finish = c.finish_reason
    return text, finish, usage, n


def test_basic():
    r = chat("Hello, who are you?", max_tokens=12)
    check(r.object == "chat.completion" and r.id.startswith("chatcmpl-"), "chat object/id")
    check(r.choices[0].message.role == "assistant", "chat role")
    check(r.usage.completion_tokens <= 12 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens,
          "chat usage sums")
    check(r.choices[0].finish_reason in ("length", "stop"), "chat finish_reason")
    if r.choices[0].finish_reason == "length":
        check(r.usage.completion_tokens == 12, "length finish uses all max_tokens")
    # the same greedy request streamed gives the same text, and the usage chunk
    s = chat("Hello, who are you?", max_tokens=12, stream=True, stream_options={"include_usage": True})
    text, finish, usage, _ = stream_text(s)
    check(text == r.choices[0].message.content, f"stream text {text!r} == non-stream {r.choices[0].message.content!r}")
    check(finish == r.choices[0].finish_reason, "stream finish_reason")
    check(usage is not None and usage.prompt_tokens == r.usage.prompt_tokens and
          usage.completion_tokens == r.usage.completion_tokens, "stream usage chunk")
    # max_completion_tokens is the same as max_tokens
    r2 = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello, who are you?"}],
                                        max_completion_tokens=12, temperature=0)
    check(r2.choices[0].message.content == r.choices[0].message.content, "max_completion_tokens")
    # completions: string prompt, streaming and not
    c = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0)
    check(c.object == "text_completion" and len(c.choices[0].text) > 0, "completion text")
    cs = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0, stream=True,
                                   stream_options={"include_usage": True})
    text, finish, usage, _ = stream_text(cs)
    check(text == c.choices[0].text, "completion stream == non-stream")
    check(usage is not None and usage.completion_tokens == c.usage.completion_tokens, "completion stream usage")
    # token-id prompt: logprobs echo the tokens, so the ids of the string prompt can be fed back
    c3 = client.completions.create(model=MODEL, prompt=[1, 2, 3, 4, 5], max_tokens=4, temperature=0)
    check(c3.usage.prompt_tokens == 5, "token-id prompt counted")
    # echo and logprobs
    c4 = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, temperature=0, echo=True,
                                   logprobs=2)
    check(c4.choices[0].text.startswith("Once upon a time"), "completion echo")
    lp = c4.choices[0].logprobs
    # (the echoed prompt's tokens come first, the first of them without a logprob, as OpenAI gives them)
    check(lp is not None and len(lp.tokens) == c4.usage.prompt_tokens + c4.usage.completion_tokens and
          lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and len(lp.top_logprobs[1]) == 2,
          "completion logprobs shape")
    # streamed, echo and logprobs: each token's text_offset is where its text starts in the echoed prompt
    # and the completion (the prompt's tokens included), however the tokens fall into chunks (a chunk
    # may carry several)
    cs4 = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0,
                                    echo=True, logprobs=1, stream=True)
    full, toks, offs = "", [], []
    for ch in cs4:
        if not ch.choices:
            continue
        full += ch.choices[0].text or ""
        if ch.choices[0].logprobs:
            toks += ch.choices[0].logprobs.tokens
            offs += ch.choices[0].logprobs.text_offset
    want, at = [], 0
    for t in toks:
        want.append(at)
        at += len(t.encode())
    check(full.startswith("Once upon a time") and len(toks) > 0 and offs == want,
          f"streamed text_offset {offs} == {want} (tokens {toks})")
    r5 = chat("Hi", max_tokens=6, logprobs=True, top_logprobs=3)
    lc = r5.choices[0].logprobs.content
    check(len(lc) == r5.usage.completion_tokens and all(len(t.top_logprobs) == 3 for t in lc) and
          all(t.logprob <= 0 for t in lc), "chat logprobs shape")
    models = client.models.list()
    check(models.data[0].id == MODEL, "models list")
    # the engine's time split: whole steps hold their forwards, and both grew with the requests above
    m = metrics()
    steps, step_s = m.get("qdelta_engine_steps_total", 0), m.get("qdelta_engine_step_seconds_total", -1)
    fwd_s = m.get("qdelta_engine_forward_seconds_total", -1)
    check(steps > 0 and fwd_s > 0 and step_s >= fwd_s + m.get("qdelta_engine_mtp_seconds_total", -1),
          f"engine time in /metrics: {steps} steps, {step_s} s in steps, {fwd_s} s in forwards")
    # the host's share split: scheduling and reporting, each inside the steps beside the forwards
    sched_s, rep_s = m.get("qdelta_engine_schedule_seconds_total", -1), m.get("qdelta_engine_report_seconds_total", -1)
    check(sched_s > 0 and rep_s > 0 and step_s >= fwd_s + sched_s + rep_s,
          f"engine host time in /metrics: {sched_s} s scheduling, {rep_s} s reporting, {step_s} s in steps")
    # the callbacks run on the reporting thread, outside the steps; the engine's waits for it too
    cb_s, wait_s = m.get("qdelta_engine_callback_seconds_total", -1), m.get("qdelta_engine_report_wait_seconds_total", -1)
    check(cb_s > 0 and wait_s >= 0, f"reporting thread in /metrics: {cb_s} s in callbacks, {wait_s} s waited for")


def test_stop_and_seed():
    base = client.completions.create(model=MODEL, prompt="The LORD said unto Moses", max_tokens=40, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    # a stop string from the middle of the greedy text: the output is the text before it
    words = base.split(" ")
    stop = " " + words[len(words) // 2] if len(words) > 3 else base[len(base) // 2:len(base) // 2 + 3]
    cut = base[:base.index(stop)]
    r = client.completions.create(model=MODEL, prompt="The LORD said unto Moses", max_tokens=40, temperature=0,
                                  stop=[stop, "zzzz-never"], extra_body={"ignore_eos": True})
    check(r.choices[0].text == cut, f"stop string: {r.choices[0].text!r} == {cut!r}")
    check(r.choices[0].finish_reason == "stop", "stop finish_reason")
    s = client.completions.create(model=MODEL, prompt="The LORD said unto Moses", max_tokens=40, temperature=0,
                                  stop=stop, stream=True, extra_body={"ignore_eos": True})
    text, finish, _, _ = stream_text(s)
    check(text == cut and finish == "stop", f"stop string streamed: {text!r}")
    # seeds: same seed, same text; sampling actually samples
    kw = dict(model=MODEL, prompt="In the beginning", max_tokens=24, temperature=1.0, top_p=1.0, extra_body={"top_k": 0})
    a = client.completions.create(seed=1234, **kw).choices[0].text
    b = client.completions.create(seed=1234, **kw).choices[0].text
    check(a == b, "same seed, same text")
    others = {client.completions.create(seed=k, **kw).choices[0].text for k in range(4)}
    check(len(others) > 1, "different seeds give different texts")
    sa = chat("Tell me a story", max_tokens=20, temperature=0.9, seed=7).choices[0].message.content
    sb = chat("Tell me a story", max_tokens=20, temperature=0.9, seed=7, stream=True)
    check(stream_text(sb)[0] == sa, "seeded chat stream == non-stream")
    # penalties and filters are accepted
    r = chat("Hi", max_tokens=8, temperature=0.8, top_p=0.9, presence_penalty=0.5, frequency_penalty=0.5, seed=3,
             extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.2})
    check(r.usage.completion_tokens >= 1, "sampling params accepted")


def test_errors():
    def expect(exc, fn, what):
        try:
            fn()
            check(False, f"{what}: no error")
        except exc as e:
            body = getattr(e, "body", None) or {}
            check(isinstance(body, dict) and "message" in body and "type" in body, f"{what}: OpenAI error shape")
        except Exception as e:  # noqa: BLE001
            check(False, f"{what}: wrong exception {type(e).__name__}: {e}")
    expect(openai.BadRequestError, lambda: chat("x", temperature="hot"), "temperature wrong type")
    expect(openai.BadRequestError, lambda: chat("x", max_tokens=-5), "negative max_tokens")
    expect(openai.BadRequestError, lambda: chat("x", max_tokens=10 ** 9), "huge max_tokens")
    expect(openai.BadRequestError, lambda: chat("x", n=17), "n > 16")
    expect(openai.BadRequestError, lambda: chat("x", stop=5), "stop wrong type")
    expect(openai.BadRequestError, lambda: chat("x", top_p=7.0), "top_p out of range")
    expect(openai.BadRequestError, lambda: chat("word " * (MAX_LEN + 50)), "prompt longer than the context")
    expect(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt=[1, -3], max_tokens=2),
           "bad token id")
    expect(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt={"a": 1}, max_tokens=2),
           "prompt wrong type")
    expect(openai.BadRequestError, lambda: client.chat.completions.create(model=MODEL, messages=[], max_tokens=2),
           "empty messages")
    expect(openai.NotFoundError, lambda: client.chat.completions.create(
        model="no-such-model", messages=[{"role": "user", "content": "x"}]), "unknown model")
    noauth = openai.OpenAI(base_url=args.url + "/v1", api_key="wrong-key", max_retries=0, timeout=30)
    expect(openai.AuthenticationError, lambda: noauth.models.list(), "wrong API key")
    st, body = raw("GET", "/v1/models", headers={"Authorization": ""})
    check(st == 401 and "error" in json.loads(body), "missing API key -> 401")
    st, body = raw("POST", "/v1/chat/completions", body='{"messages": [')
    check(st == 400 and json.loads(body)["error"]["type"] == "invalid_request_error", "malformed JSON -> 400")
    st, body = raw("POST", "/v1/chat/completions", body="[1, 2]")
    check(st == 400, "non-object JSON -> 400")
    st, _ = raw("GET", "/v1/nope")
    check(st == 404, "unknown route -> 404")
    st, _ = raw("GET", "/v1/chat/completions")
    check(st == 405, "wrong method -> 405")
    # the server answers 413 as soon as it sees the Content-Length and closes, so the
    # client may fail to send the rest: read the reply from a raw socket
    s = socket.create_connection((U.hostname, U.port), timeout=30)
    try:
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {args.api_key}\r\n"
                  f"Content-Length: {5 << 20}\r\n\r\n".encode() + b"x" * (5 << 20))
    except OSError:
        pass
    got = b""
    try:
        while b"\r\n\r\n" not in got:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    s.close()
    check(got.startswith(b"HTTP/1.1 413"), f"body too large -> 413 ({got[:40]!r})")
    st, _ = raw("GET", "/health", headers={"Authorization": ""})
    check(st == 200, "/health needs no key")
    # unknown fields are ignored
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi", "name": "bob", "x": [1]}],
                                       max_tokens=4, temperature=0,
                                       extra_body={"some_future_field": {"a": 1}, "user": "u1", "service_tier": "auto"})
    check(r.usage.completion_tokens >= 1, "unknown fields ignored")


def test_tools_and_reasoning():
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    tm = tclient.models.list().data[0].id
    a = tclient.chat.completions.create(model=tm, messages=msgs, max_tokens=2, temperature=0)
    b = tclient.chat.completions.create(model=tm, messages=msgs, tools=tools, max_tokens=2, temperature=0)
    # the tool's JSON schema is rendered into the system prompt: dozens of tokens more
    check(b.usage.prompt_tokens > a.usage.prompt_tokens + 20,
          f"tools rendered into the prompt ({a.usage.prompt_tokens} -> {b.usage.prompt_tokens})")
    # the Qwen3.5 template opens <think> when thinking is on: the output is reasoning
    r = tclient.chat.completions.create(model=tm, messages=msgs, max_tokens=8, temperature=0,
                                        extra_body={"chat_template_kwargs": {"enable_thinking": True}, "ignore_eos": True})
    rc = getattr(r.choices[0].message, "reasoning_content", None)
    if rc is None and r.choices[0].message.model_extra:
        rc = r.choices[0].message.model_extra.get("reasoning_content")
    check(rc is not None and len(rc) > 0, f"reasoning_content with thinking on: {r.choices[0].message}")
    r2 = tclient.chat.completions.create(model=tm, messages=msgs, max_tokens=8, temperature=0,
                                         extra_body={"enable_thinking": False, "ignore_eos": True})
    check(r2.usage.prompt_tokens != r.usage.prompt_tokens, "enable_thinking changes the rendered prompt")
    s = tclient.chat.completions.create(model=tm, messages=msgs, max_tokens=8, temperature=0, stream=True,
                                        extra_body={"chat_template_kwargs": {"enable_thinking": True}, "ignore_eos": True})
    rs = ""
    for ch in s:
        for c in ch.choices:
            rs += (c.delta.model_extra or {}).get("reasoning_content") or ""
    check(rs == rc, "streamed reasoning_content == non-stream")


def wait_idle(timeout=10.0):
    t0 = time.time()
    m = metrics()
    while time.time() - t0 < timeout:
        m = metrics()
        if (m.get("qdelta_num_requests_running", 1) == 0 and m.get("qdelta_state_slots_used", 1) == 0 and
                m.get("qdelta_kv_blocks_used", 1) == 0 and m.get("qdelta_num_requests_waiting", 1) == 0):
            return m, True
        time.sleep(0.05)
    return m, False


def test_disconnect():
    m0 = metrics()
    body = json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0,
                       "stream": True, "ignore_eos": True})
    for _ in range(3):
        s = socket.create_connection((U.hostname, U.port), timeout=30)
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {args.api_key}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
        got = b""
        while got.count(b"data: ") < 3:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        check(b"200 OK" in got, "stream started before the disconnect")
        mid = metrics()
        check(mid.get("qdelta_num_requests_running", 0) >= 1 and mid.get("qdelta_kv_blocks_used", 0) >= 1,
              "a running stream holds a slot and blocks")
        s.close()
        t_close = time.time()
        m, idle = wait_idle(5.0)
        check(idle, f"slot and blocks freed after disconnect: {m}")
        print(f"  disconnect: freed after {time.time() - t_close:.3f}s", flush=True)
    # a non-streaming request whose client gives up is noticed while it runs too
    body = json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 450, "temperature": 0,
                       "ignore_eos": True})
    s = socket.create_connection((U.hostname, U.port), timeout=30)
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {args.api_key}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
    t_start = time.time()
    mid_gen = metrics()["qdelta_generation_tokens_total"]
    while time.time() - t_start < 10 and metrics().get("qdelta_num_requests_running", 0) < 1:
        time.sleep(0.01)
    s.close()
    t_close = time.time()
    m, idle = wait_idle(5.0)
    check(idle, f"non-streaming request cancelled after disconnect: {m}")
    print(f"  non-streaming disconnect: freed after {time.time() - t_close:.3f}s", flush=True)
    done = metrics()["qdelta_generation_tokens_total"] - mid_gen
    check(done < 450, f"the non-streaming request stopped early ({done} of 450 tokens)")
    m1 = metrics()
    check(m1["qdelta_generations_cancelled_total"] >= m0.get("qdelta_generations_cancelled_total", 0) + 4,
          "disconnects counted as cancelled")
    gen = m1["qdelta_generation_tokens_total"] - m0.get("qdelta_generation_tokens_total", 0)
    check(gen < 3 * 400 + 450, f"cancelled requests stopped early ({gen} tokens for 3 x 400 + 450)")


def run_threads(n, fn):
    out, errs = [None] * n, []

    def wrap(i):
        try:
            out[i] = fn(i)
        except Exception as e:  # noqa: BLE001
            errs.append(f"{i}: {type(e).__name__}: {e}")
    ts = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=600)
    check(not errs, f"threads failed: {errs[:3]}")
    return out


def test_concurrent_streams():
    per_thread = 2  # bounded request loop per client

    def one(i):
        done = 0
        for k in range(per_thread):
            s = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"Story {i} {k}"}],
                                               max_tokens=12 + i % 5, temperature=0.7, seed=i, stream=True,
                                               stream_options={"include_usage": True})
            _, finish, usage, _ = stream_text(s)
            done += finish in ("length", "stop") and usage is not None and usage.completion_tokens >= 1
        return done
    t0 = time.time()
    res = run_threads(64, one)
    check(sum(r or 0 for r in res) == 64 * per_thread, f"64 concurrent streams x {per_thread} all finished")
    print(f"  64 streams x {per_thread}: {time.time() - t0:.2f}s", flush=True)
    _, idle = wait_idle(10)
    check(idle, "idle after the concurrent streams")


def test_batch_invariance():
    prompts = [("word " * (3 + 7 * i)) + f"story number {i}:" for i in range(16)]
    lens = [8 + 3 * i for i in range(16)]

    def req(i):
        return client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=lens[i], temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text
    alone = [req(i) for i in range(16)]
    together = run_threads(16, req)
    bad = [i for i in range(16) if alone[i] != together[i]]
    check(not bad, f"greedy outputs under concurrency identical to alone (differ: {bad})")
    # streamed and batched too
    def sreq(i):
        s = client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=lens[i], temperature=0, stream=True,
                                      extra_body={"ignore_eos": True})
        return stream_text(s)[0]
    streamed = run_threads(16, sreq)
    bad = [i for i in range(16) if alone[i] != streamed[i]]
    check(not bad, f"concurrent streamed greedy outputs identical to alone (differ: {bad})")


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_soak():
    n, conc = args.soak, 8
    counter = [0]
    lock = threading.Lock()

    def worker(_):
        ok = 0
        c = http.client.HTTPConnection(U.hostname, U.port, timeout=60)  # keep-alive
        while True:
            with lock:
                if counter[0] >= n:
                    break
                k = counter[0]
                counter[0] += 1
            stream = k % 2 == 1
            body = json.dumps({"model": MODEL, "prompt": f"soak {k}", "max_tokens": 1 + k % 3, "temperature": 0.5,
                               "seed": k, "stream": stream})
            c.request("POST", "/v1/completions", body=body,
                      headers={"Authorization": "Bearer " + args.api_key, "Content-Type": "application/json"})
            r = c.getresponse()
            text = r.read()
            ok += r.status == 200 and (not stream or text.endswith(b"data: [DONE]\n\n"))
        c.close()
        return ok
    # warm up, then measure RSS over the run
    for _ in range(50):
        client.completions.create(model=MODEL, prompt="warm", max_tokens=2)
    r0 = rss_kb(args.pid) if args.pid else 0
    t0 = time.time()
    half = [0]

    def sampler():
        while counter[0] < n:
            if counter[0] >= n // 2 and not half[0]:
                half[0] = rss_kb(args.pid) if args.pid else 0
            time.sleep(0.05)
    th = threading.Thread(target=sampler)
    th.start()
    res = run_threads(conc, worker)
    th.join(timeout=60)
    r1 = rss_kb(args.pid) if args.pid else 0
    dt = time.time() - t0
    check(sum(r or 0 for r in res) == n, f"soak: all {n} requests answered 200")
    print(f"  soak: {n} requests in {dt:.1f}s ({n / dt:.0f} req/s); RSS {r0} kB -> {half[0]} kB (half) -> {r1} kB",
          flush=True)
    if args.pid and args.soak_rss_check:
        # flat = the second half of the run does not grow RSS beyond allocator noise
        check(r1 - max(half[0], r0) < 8 * 1024, f"RSS flat over the soak ({r0} -> {half[0]} -> {r1} kB)")
    m = metrics()
    check(m.get("qdelta_open_generations", 1) == 0, "no generation objects left after the soak")


TESTS = [test_basic, test_stop_and_seed, test_errors, test_tools_and_reasoning, test_disconnect,
         test_concurrent_streams, test_batch_invariance, test_soak]
for t in TESTS:
    if args.only and args.only not in t.__name__:
        continue
    t0 = time.time()
    n0 = len(failures)
    t()
    print(f"{'ok  ' if len(failures) == n0 else 'FAIL'} {t.__name__} ({time.time() - t0:.1f}s)", flush=True)
print(f"test_server.py: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
