#!/usr/bin/env python3
"""What evaluation harnesses use on /v1/completions, on the default model served in
batch-invariant mode (a request's tokens and logprobs are the same numbers alone or
batched). The prompt's logprobs (`echo` with `logprobs`, as OpenAI's legacy API gives them
and lm-evaluation-harness scores text with them):

- a greedy reply's own logprobs come back as prompt logprobs when prompt + reply is sent
  again with echo (max_tokens 0 and 1), the top alternative being the token itself;
- the first prompt token has null for its logprob and alternatives; tokens, offsets and
  the echoed text agree; the same streamed; n = 2 gives each choice the prompt's;
- a prompt longer than one engine step's prompt rows (256) is reported whole;
- the request lm-evaluation-harness sends (a one-element batch of token ids, max_tokens
  1, echo, logprobs 1) and its scoring of it;
- max_tokens 0 without echo is refused naming the field.
Without max_tokens a completion stops at 16 tokens, a chat reply does not.
/tokenize, /detokenize and /tokenizer_info (vLLM's): a prompt's ids as the echo gives them, a
chat's as chat completions bills them, text round trips, the end-of-text token and the chat
template's source, bad requests refused naming the field.
Several prompts in one request (the batch form, lm-evaluation-harness's batch_size): each
prompt's n choices numbered after the ones before, each the reply that prompt gets alone,
streamed too; usage counts every prompt.

Run by tests/cli_completions_scoring.sh (--url of a server without an API key)."""
import argparse
import http.client
import json
import math
import sys
import urllib.parse

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--url-small", help="the same model with one sequence slot and a queue of two")
args = ap.parse_args()
U = urllib.parse.urlparse(args.url)
failures = []
_c = http.client.HTTPConnection(U.hostname, U.port, timeout=60)
_c.request("GET", "/v1/models")
MODEL = json.loads(_c.getresponse().read())["data"][0]["id"]


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr, flush=True)
    return cond


def post(body, path="/v1/completions"):
    c = http.client.HTTPConnection(U.hostname, U.port, timeout=120)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    return r.status, r.read().decode()


def complete(**kw):
    # greedy without the model's default repetition penalty: the reply is each row's argmax
    body = {"model": MODEL, "temperature": 0, "repetition_penalty": 1.0, "return_tokens_as_token_ids": True}
    body.update(kw)
    st, text = post(body)
    check(st == 200, f"completion {kw.get('max_tokens')} -> {st}: {text[:300]}")
    return json.loads(text) if st == 200 else None


def ids(lp):
    return [int(t.split(":")[1]) for t in lp["tokens"]]


PROMPT = "In the spring of that year the river rose and the"
gen = complete(prompt=PROMPT, max_tokens=10, logprobs=2)
g = gen["choices"][0]["logprobs"]
gen_ids, gen_lps = ids(g), g["token_logprobs"]
check(len(gen_ids) == 10, f"reference reply: 10 tokens {gen_ids}")

# the prompt's ids: echo with max_tokens 0 returns exactly the prompt's tokens
only = complete(prompt=PROMPT, max_tokens=0, echo=True, logprobs=2)
c0 = only["choices"][0]
lp0 = c0["logprobs"]
prompt_ids = ids(lp0)
n = len(prompt_ids)
check(n == only["usage"]["prompt_tokens"] and only["usage"]["completion_tokens"] == 0,
      f"max_tokens 0: {n} tokens, usage {only['usage']}")
check(c0["finish_reason"] == "length" and c0["text"] == PROMPT, f"max_tokens 0: text {c0['text']!r}, {c0['finish_reason']}")
check(lp0["token_logprobs"][0] is None and lp0["top_logprobs"][0] is None, "the first token: null logprob")
check(all(isinstance(x, float) and x <= 0 for x in lp0["token_logprobs"][1:]), "the others: logprobs <= 0")
check(all(isinstance(t, dict) and len(t) == 2 for t in lp0["top_logprobs"][1:]), "two alternatives each")
off = lp0["text_offset"]
check(off[0] == 0 and all(a <= b for a, b in zip(off, off[1:])) and off[-1] < len(PROMPT.encode()),
      f"text offsets rise within the prompt: {off}")

# prompt + reply with echo: the reply's logprobs, and each the top alternative (greedy)
both = complete(prompt=prompt_ids + gen_ids, max_tokens=0, echo=True, logprobs=1)
lpb = both["choices"][0]["logprobs"]
tail = lpb["token_logprobs"][n:]
check(ids(lpb) == prompt_ids + gen_ids, "echoed ids = prompt + reply")
# (a generated token's row came through the decode steps' recurrence, the echoed one through
# the prefill's chunked form: equal up to rounding)
check(len(tail) == 10 and all(abs(a - b) < 1e-4 for a, b in zip(tail, gen_lps)),
      f"prompt logprobs of the reply = its logprobs when generated: {tail} vs {gen_lps}")
check(all(top.get(f"token_id:{t}") == lp and lp == max(top.values())
          for t, lp, top in zip(gen_ids, tail, lpb["top_logprobs"][n:])),
      "each reply token is its position's top alternative, with the same number")
check(lpb["token_logprobs"][:n] == lp0["token_logprobs"], "the prompt part is the prompt-only report")

# max_tokens 1 (what lm-evaluation-harness sends): the same echo, then one generated token
one = complete(prompt=prompt_ids, max_tokens=1, echo=True, logprobs=2)
lp1 = one["choices"][0]["logprobs"]
check(lp1["token_logprobs"][:n] == lp0["token_logprobs"] and lp1["top_logprobs"][:n] == lp0["top_logprobs"]
      and ids(lp1) == prompt_ids + gen_ids[:1] and abs(lp1["token_logprobs"][n] - gen_lps[0]) < 1e-4,
      "max_tokens 1: the prompt's report, then the first reply token")
check(one["choices"][0]["text"] == PROMPT + gen["choices"][0]["text"][:len(one["choices"][0]["text"]) - len(PROMPT)],
      "max_tokens 1: the echoed text, then the token's")

# the same streamed: the chunks' logprobs joined are the whole response's
c = http.client.HTTPConnection(U.hostname, U.port, timeout=120)
c.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
          body=json.dumps({"model": MODEL, "prompt": prompt_ids, "max_tokens": 3, "echo": True, "logprobs": 2,
                           "temperature": 0, "repetition_penalty": 1.0, "stream": True,
                           "return_tokens_as_token_ids": True}))
r = c.getresponse()
joined = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
text = ""
for line in r.read().decode().split("\n"):
    if not line.startswith("data: ") or line == "data: [DONE]":
        continue
    ch = json.loads(line[6:])["choices"]
    if not ch:
        continue
    text += ch[0]["text"]
    for k in joined:
        if ch[0]["logprobs"]:
            joined[k] += ch[0]["logprobs"][k]
three = complete(prompt=prompt_ids, max_tokens=3, echo=True, logprobs=2)
check(joined == three["choices"][0]["logprobs"] and text == three["choices"][0]["text"],
      "streamed: the same logprobs and text as the whole response")

# n = 2: each choice carries the prompt's report (the second one forked from the first's prefill)
two = complete(prompt=prompt_ids, max_tokens=2, echo=True, logprobs=2, n=2)
check(len(two["choices"]) == 2 and all(
    ch["logprobs"]["token_logprobs"][:n] == lp0["token_logprobs"] and ch["logprobs"]["tokens"][:n] == lp0["tokens"]
    for ch in two["choices"]), "n = 2: both choices have the prompt's logprobs")

# longer than one step's 256 prompt rows: every position, and the short prompt's report as its start
long_ids = (prompt_ids + gen_ids) * 20
lng = complete(prompt=long_ids, max_tokens=0, echo=True, logprobs=0)
lpl = lng["choices"][0]["logprobs"]
check(ids(lpl) == long_ids and lpl["token_logprobs"][0] is None and
      all(isinstance(x, float) for x in lpl["token_logprobs"][1:]), f"{len(long_ids)} tokens: every position reported")
check(lpl["token_logprobs"][:n + 10] == lpb["token_logprobs"], "its start = the shorter prompt's report")

# lm-evaluation-harness's loglikelihood request and scoring (ctxlen tokens of context, a continuation)
ctxlen = n
st, body = post({"model": MODEL, "prompt": [prompt_ids + gen_ids[:4]], "temperature": 0, "max_tokens": 1,
                 "logprobs": 1, "seed": 1234, "echo": True})
check(st == 200, f"lm-eval request: {st} {body[:200]}")
if st == 200:
    ch = json.loads(body)["choices"][0]
    logprobs = sum(ch["logprobs"]["token_logprobs"][ctxlen:-1])
    is_greedy = all(tok == max(top.values()) for tok, top in
                    zip(ch["logprobs"]["token_logprobs"][ctxlen:-1], ch["logprobs"]["top_logprobs"][ctxlen:-1]))
    check(math.isclose(logprobs, sum(lpb["token_logprobs"][n:n + 4]), rel_tol=0, abs_tol=0) and is_greedy,
          f"lm-eval scoring: {logprobs} vs {sum(lpb['token_logprobs'][n:n + 4])}, greedy {is_greedy}")

# several prompts in one request: prompt k's n choices are k * n .. k * n + n - 1, each what the
# prompt gets alone (the same numbers: batch-invariant), a string prompt beside id prompts
prompts = [prompt_ids, "The weather was", prompt_ids + gen_ids[:3]]
alone = [complete(prompt=p, max_tokens=5, echo=True, logprobs=1, n=2, seed=7, temperature=0.8) for p in prompts]
batch = complete(prompt=prompts, max_tokens=5, echo=True, logprobs=1, n=2, seed=7, temperature=0.8)
chs = sorted(batch["choices"], key=lambda c: c["index"])
check([c["index"] for c in chs] == list(range(6)), f"batch: choice indices {[c['index'] for c in chs]}")
for k, a in enumerate(alone):
    for j in range(2):
        x, y = chs[k * 2 + j], a["choices"][j]
        check(x["text"] == y["text"] and x["logprobs"] == y["logprobs"] and x["finish_reason"] == y["finish_reason"],
              f"batch: prompt {k} choice {j} = the prompt alone ({x['text']!r} vs {y['text']!r})")
check(batch["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone) and
      batch["usage"]["completion_tokens"] == sum(a["usage"]["completion_tokens"] for a in alone),
      f"batch usage {batch['usage']}")
# streamed: each choice's chunks joined are its text
c = http.client.HTTPConnection(U.hostname, U.port, timeout=120)
c.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
          body=json.dumps({"model": MODEL, "prompt": prompts, "max_tokens": 5, "echo": True, "n": 2, "seed": 7,
                           "temperature": 0.8, "repetition_penalty": 1.0, "stream": True}))
texts = {}
for line in c.getresponse().read().decode().split("\n"):
    if line.startswith("data: {"):
        for ch in json.loads(line[6:])["choices"]:
            texts[ch["index"]] = texts.get(ch["index"], "") + ch["text"]
check(texts == {c["index"]: c["text"] for c in chs}, "batch streamed: the same texts by index")
# lm-evaluation-harness with batch_size 2: contexts of different lengths, scored each
st, body = post({"model": MODEL, "prompt": [prompt_ids + gen_ids[:4], prompt_ids[:5] + gen_ids[:2]], "temperature": 0,
                 "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True})
check(st == 200 and [len(c["logprobs"]["tokens"]) for c in sorted(json.loads(body)["choices"], key=lambda c: c["index"])]
      == [n + 5, 8], f"lm-eval batch of 2: {st} {body[:200]}")

# a batch whose later prompt finds the queue full: a 503, the prompts queued before it cancelled
# (the queue is whole again afterwards: the same batch less one prompt is served)
if args.url_small:
    S = urllib.parse.urlparse(args.url_small)
    busy = http.client.HTTPConnection(S.hostname, S.port, timeout=120)
    busy.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
                 body=json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 300, "ignore_eos": True,
                                  "stream": True}))
    resp = busy.getresponse()
    resp.read(1)  # its first chunk came: it holds the one slot, the queue is empty

    def post_small(body):
        c = http.client.HTTPConnection(S.hostname, S.port, timeout=120)
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read().decode()

    st, body = post_small({"model": MODEL, "prompt": [[1, 2], [3, 4], [5, 6]], "max_tokens": 2})
    check(st == 503 and "server_busy" in body, f"batch past the queue: {st} {body[:200]}")
    resp.read()
    st, body = post_small({"model": MODEL, "prompt": [[1, 2], [3, 4]], "max_tokens": 2})
    check(st == 200 and len(json.loads(body)["choices"]) == 2, f"then a batch of two: {st} {body[:200]}")

# /tokenize and /detokenize (vLLM's): the ids the generation routes feed the model
st, body = post({"model": MODEL, "prompt": PROMPT}, "/tokenize")
tk = json.loads(body) if st == 200 else {}
check(st == 200 and tk["tokens"] == prompt_ids and tk["count"] == n and tk["max_model_len"] == 1024,
      f"/tokenize of the prompt = its ids in the echo: {body[:200]}")
for text in [PROMPT, "caf\u00e9 \u4e16\u754c \U0001F600 <|im_start|> x", ""]:
    st, body = post({"prompt": text}, "/tokenize")
    st2, body2 = post({"tokens": json.loads(body)["tokens"]}, "/detokenize") if st == 200 else (0, "")
    check(st2 == 200 and json.loads(body2)["prompt"] == text, f"detokenize(tokenize({text!r})): {body2[:200]}")
CHAT = [{"role": "user", "content": "What is the river like in spring?"}]
st, body = post({"model": MODEL, "messages": CHAT, "max_tokens": 1, "temperature": 0}, "/v1/chat/completions")
st2, body2 = post({"messages": CHAT, "return_token_strs": True}, "/tokenize")
st3, body3 = post({"messages": CHAT, "add_generation_prompt": False}, "/tokenize")
if check(st == 200 and st2 == 200 and st3 == 200, f"/tokenize of a chat: {st} {st2} {st3} {body2[:200]}"):
    full, hist = json.loads(body2), json.loads(body3)
    check(full["count"] == json.loads(body)["usage"]["prompt_tokens"] and len(full["token_strs"]) == full["count"],
          "/tokenize of a chat: the count chat completions bills, with each token's text")
    check(hist["count"] < full["count"] and full["tokens"][:hist["count"]] == hist["tokens"],
          "add_generation_prompt false: a prefix of it")
# /tokenizer_info (with /tokenize, what lm-evaluation-harness's remote tokenizer needs): the end-of-text
# token's text tokenizes to one id, and the chat template renders the chat as the server does
c = http.client.HTTPConnection(U.hostname, U.port, timeout=60)
c.request("GET", "/tokenizer_info")
r = c.getresponse()
info = json.loads(r.read()) if r.status == 200 else {}
st, body = post({"prompt": info.get("eos_token") or ""}, "/tokenize")
check(r.status == 200 and st == 200 and len(json.loads(body)["tokens"]) == 1 and info["model_max_length"] == 1024,
      f"/tokenizer_info: {str(info)[:200]}; its eos_token is one token: {body[:100]}")
check(isinstance(info.get("chat_template"), str) and "add_generation_prompt" in info["chat_template"],
      "/tokenizer_info: the chat template's source")
for path, req, param in [("/tokenize", {"prompt": "x", "messages": CHAT}, "prompt"), ("/tokenize", {}, "messages"),
                         ("/tokenize", {"prompt": 5}, "prompt"), ("/tokenize", {"prompt": "x", "model": "other"}, "model"),
                         ("/tokenize", {"messages": CHAT, "add_generation_prompt": "yes"}, "add_generation_prompt"),
                         ("/detokenize", {"tokens": [1, -1]}, "tokens"), ("/detokenize", {"tokens": "1"}, "tokens"),
                         ("/detokenize", {"tokens": [1, 10 ** 9]}, "tokens")]:
    st, body = post(req, path)
    check(st in (400, 404) and json.loads(body)["error"]["param"] == param, f"{path} {req}: {st} {body[:200]}")

# without max_tokens a completion stops at 16 tokens (OpenAI's and vLLM's default); a chat reply does not
d = complete(prompt=PROMPT, ignore_eos=True)
check(d["usage"]["completion_tokens"] == 16 and d["choices"][0]["finish_reason"] == "length",
      f"completions' default max_tokens: {d['usage']}")
st, body = post({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "ignore_eos": True,
                 "temperature": 0}, "/v1/chat/completions")
check(st == 200 and json.loads(body)["usage"]["completion_tokens"] > 16, f"chat: no such default: {body[-120:]}")

# refused
st, body = post({"model": MODEL, "prompt": PROMPT, "max_tokens": 0})
check(st == 400 and "max_tokens" in body and "echo" in body, f"max_tokens 0 without echo: {st} {body[:200]}")
st, body = post({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0},
                "/v1/chat/completions")
check(st == 400 and "max_tokens" in body, f"chat max_tokens 0: {st} {body[:200]}")

if failures:
    print(f"{len(failures)} failed", file=sys.stderr)
    sys.exit(1)
print("test_completions_scoring: all passed")
