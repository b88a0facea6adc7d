#!/usr/bin/env python3
"""End-to-end tests of POST /v1/messages and /v1/messages/count_tokens through the
official `anthropic` client (and raw HTTP where the client cannot express the case).

Run by tests/cli_anthropic.sh, which starts the servers:
  --url URL --api-key KEY   the default model with an API key
  --tools-url URL           the default model with the Qwen3.5 chat template (renders
                            tools in the XML form, thinking on/off), no key
Replies are greedy (temperature 0) and compared with what the OpenAI route answers for
the same conversation in OpenAI's form: the translation must render the same prompt
(same prompt token count) and so generate the same text. Exits nonzero on a failure;
a missing `anthropic` or `openai` module is a failure, not a skip."""
import argparse
import http.client
import json
import sys
import urllib.parse

try:
    import anthropic
    import openai
except ImportError as e:
    print(f"FAIL: {e} (python3 -m pip install anthropic openai)", file=sys.stderr)
    sys.exit(1)

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--api-key", required=True)
ap.add_argument("--tools-url", required=True)
args = ap.parse_args()

A = anthropic.Anthropic(base_url=args.url, api_key=args.api_key, max_retries=0, timeout=120)
T = anthropic.Anthropic(base_url=args.tools_url, api_key="unused", max_retries=0, timeout=120)
OA = openai.OpenAI(base_url=args.url + "/v1", api_key=args.api_key, max_retries=0, timeout=120)
OT = openai.OpenAI(base_url=args.tools_url + "/v1", api_key="unused", max_retries=0, timeout=120)
MODEL = OA.models.list().data[0].id
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr, flush=True)
    return cond


def raw(path, body, headers=None, url=args.url):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    h = {"x-api-key": args.api_key, "Content-Type": "application/json", "anthropic-version": "2023-06-01"}
    h.update(headers or {})
    c.request("POST", path, body=body if isinstance(body, (str, bytes)) else json.dumps(body), headers=h)
    r = c.getresponse()
    return r.status, r.read().decode()


def text_of(msg):
    return "".join(b.text for b in msg.content if b.type == "text")


def expect_error(fn, exc, status, words, what):
    try:
        fn()
    except exc as e:
        body = e.body if isinstance(e.body, dict) else {}
        err = body.get("error", {}) if isinstance(body, dict) else {}
        check(e.status_code == status, f"{what}: status {e.status_code}, wanted {status}")
        check(body.get("type") == "error" and isinstance(err.get("type"), str), f"{what}: Anthropic error shape: {body}")
        msg = err.get("message", "")
        for w in words:
            check(w in msg, f"{what}: message names '{w}': {msg!r}")
        return
    except Exception as e:  # noqa: BLE001
        check(False, f"{what}: raised {type(e).__name__} {e}, wanted {exc.__name__}")
        return
    check(False, f"{what}: no error")


SAMPLING = ("temperature", "top_p", "top_k")


def sampling_in_body(kw):
    """The client of this SDK version has no temperature / top_p / top_k arguments (the
    API still takes them): they go in the body through extra_body."""
    extra = dict(kw.pop("extra_body", None) or {})
    for k in SAMPLING:
        if k in kw:
            extra[k] = kw.pop(k)
    if extra:
        kw["extra_body"] = extra
    return kw


def create(client, **kw):
    return client.messages.create(**sampling_in_body(kw))


def stream(client, **kw):
    return client.messages.stream(**sampling_in_body(kw))


HELLO = [{"role": "user", "content": "Hello, who are you?"}]

# ------------------------------------------------------------------------ create
m = create(A, model=MODEL, max_tokens=16, temperature=0, messages=HELLO, system="Answer briefly.")
check(m.type == "message" and m.role == "assistant" and m.id.startswith("msg_"), f"create: message object {m}")
check(m.model == MODEL, "create: model")
check(len(m.content) == 1 and m.content[0].type == "text" and len(m.content[0].text) > 0, f"create: one text block {m.content}")
check(m.stop_reason in ("max_tokens", "end_turn"), f"create: stop_reason {m.stop_reason}")
check(m.usage.output_tokens >= 1 and m.usage.output_tokens <= 16, f"create: usage.output_tokens {m.usage}")
check(m.stop_reason != "max_tokens" or m.usage.output_tokens == 16, "create: max_tokens reached = 16 tokens")
o = OA.chat.completions.create(model=MODEL, max_tokens=16, temperature=0,
                               messages=[{"role": "system", "content": "Answer briefly."}] + HELLO)
check(o.usage.prompt_tokens == m.usage.input_tokens, f"create: input_tokens {m.usage.input_tokens} = OpenAI route's {o.usage.prompt_tokens}")
check(o.choices[0].message.content == text_of(m), f"create: same greedy text as the OpenAI route: {text_of(m)!r} vs {o.choices[0].message.content!r}")
# system as blocks = system as a string
m2 = create(A, model=MODEL, max_tokens=16, temperature=0, messages=HELLO,
                       system=[{"type": "text", "text": "Answer briefly."}])
check(text_of(m2) == text_of(m) and m2.usage.input_tokens == m.usage.input_tokens, "create: system blocks = system string")
# content as blocks = content as a string
m3 = create(A, model=MODEL, max_tokens=16, temperature=0, system="Answer briefly.",
                       messages=[{"role": "user", "content": [{"type": "text", "text": "Hello, who are you?"}]}])
check(text_of(m3) == text_of(m), "create: text blocks = string content")
# sampling fields accepted; top_k = 1 is greedy whatever the temperature
m4 = create(A, model=MODEL, max_tokens=16, temperature=1.0, top_k=1, top_p=0.9, messages=HELLO, system="Answer briefly.")
check(text_of(m4) == text_of(m), "create: top_k 1 = greedy")

# ------------------------------------------------------------------------ count_tokens
ct = A.messages.count_tokens(model=MODEL, messages=HELLO, system="Answer briefly.")
check(ct.input_tokens == m.usage.input_tokens, f"count_tokens {ct.input_tokens} = usage.input_tokens {m.usage.input_tokens}")
ct0 = A.messages.count_tokens(model=MODEL, messages=HELLO)
check(ct0.input_tokens < ct.input_tokens, "count_tokens: the system prompt counts")

# ------------------------------------------------------------------------ stop_sequences
long = create(A, model=MODEL, max_tokens=40, temperature=0, messages=HELLO)
words = [w for w in text_of(long).split() if len(w) >= 3 and text_of(long).index(w) > 0]
if check(len(words) > 0, f"stop: a word to stop at in {text_of(long)!r}"):
    w = words[len(words) // 2]
    s = create(A, model=MODEL, max_tokens=40, temperature=0, messages=HELLO, stop_sequences=[w, "never-seen-zz"])
    check(s.stop_reason == "stop_sequence" and s.stop_sequence == w, f"stop: stop_reason {s.stop_reason} {s.stop_sequence!r} (wanted {w!r})")
    check(text_of(s) == text_of(long)[:text_of(long).index(w)], f"stop: text cut before the stop sequence: {text_of(s)!r}")

# ------------------------------------------------------------------------ streaming
events = list(create(A, model=MODEL, max_tokens=16, temperature=0, messages=HELLO, system="Answer briefly.", stream=True))
kinds = [e.type for e in events]
check(kinds[0] == "message_start" and kinds[-1] == "message_stop" and kinds[-2] == "message_delta", f"stream: event order {kinds}")
st_, sse = raw("/v1/messages", {"model": MODEL, "max_tokens": 4, "messages": HELLO, "stream": True})
names = [l[7:] for l in sse.splitlines() if l.startswith("event: ")]
check(st_ == 200 and names[:2] == ["message_start", "ping"] and names[-1] == "message_stop" and "data: [DONE]" not in sse,
      f"stream (raw): message_start, ping, ..., message_stop: {names}")
for l in sse.splitlines():
    if l.startswith("data: "):
        check(isinstance(json.loads(l[6:]).get("type"), str), f"stream (raw): every data line is a typed event: {l}")
check(kinds.count("content_block_start") == 1 and kinds.count("content_block_stop") == 1, f"stream: one block {kinds}")
si, ei = kinds.index("content_block_start"), kinds.index("content_block_stop")
check(all(k == "content_block_delta" for k in kinds[si + 1:ei]) and ei > si + 1, "stream: deltas inside the block")
check(events[0].message.usage.input_tokens == m.usage.input_tokens, "stream: message_start usage.input_tokens")
check(events[-2].usage.output_tokens == m.usage.output_tokens and events[-2].delta.stop_reason == m.stop_reason,
      "stream: message_delta usage and stop_reason")
streamed = "".join(e.delta.text for e in events if e.type == "content_block_delta")
check(streamed == text_of(m), f"stream: text = non-stream text ({streamed!r})")
with stream(A, model=MODEL, max_tokens=16, temperature=0, messages=HELLO, system="Answer briefly.") as st:
    pieces = list(st.text_stream)
    fin = st.get_final_message()
check("".join(pieces) == text_of(m) and text_of(fin) == text_of(m), "stream helper: text_stream and final message")
check(fin.usage.output_tokens == m.usage.output_tokens, "stream helper: usage")

# ------------------------------------------------------------------------ thinking (Qwen3.5 template)
# thinking on: the template opens <think>, everything up to </think> is reasoning
tq = [{"role": "user", "content": "What is two plus two?"}]
th = create(T, model=MODEL, max_tokens=24, temperature=0, messages=tq, thinking={"type": "enabled", "budget_tokens": 1024})
ot = OT.chat.completions.create(model=MODEL, max_tokens=24, temperature=0, messages=tq, extra_body={"enable_thinking": True})
reasoning = getattr(ot.choices[0].message, "reasoning_content", None) or ""
check(len(th.content) >= 1 and th.content[0].type == "thinking", f"thinking: first block is thinking {th.content}")
if th.content and th.content[0].type == "thinking":
    check(th.content[0].thinking == reasoning, f"thinking: = OpenAI reasoning_content: {th.content[0].thinking!r} vs {reasoning!r}")
check(text_of(th) == (ot.choices[0].message.content or ""), "thinking: text = OpenAI content")
ev = list(create(T, model=MODEL, max_tokens=24, temperature=0, messages=tq, thinking={"type": "enabled", "budget_tokens": 1024}, stream=True))
starts = [e.content_block.type for e in ev if e.type == "content_block_start"]
check(starts and starts[0] == "thinking", f"thinking stream: a thinking block first {starts}")
tstream = "".join(e.delta.thinking for e in ev if e.type == "content_block_delta" and e.delta.type == "thinking_delta")
check(tstream == reasoning, "thinking stream: thinking deltas = reasoning")
off = create(T, model=MODEL, max_tokens=12, temperature=0, messages=tq)
ooff = OT.chat.completions.create(model=MODEL, max_tokens=12, temperature=0, messages=tq, extra_body={"enable_thinking": False})
check(all(b.type != "thinking" for b in off.content) and text_of(off) == ooff.choices[0].message.content,
      "thinking off by default (as Anthropic): = OpenAI with enable_thinking false")

# ------------------------------------------------------------------------ tools
TOOLS = [{"name": "get_weather", "description": "Weather of a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
OTOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": TOOLS[0]["input_schema"]}}]
c0 = T.messages.count_tokens(model=MODEL, messages=tq)
c1 = T.messages.count_tokens(model=MODEL, messages=tq, tools=TOOLS)
check(c1.input_tokens > c0.input_tokens + 20, f"tools: rendered into the prompt ({c0.input_tokens} -> {c1.input_tokens})")
# the round trip: an assistant tool_use answered by a user tool_result, as the OpenAI route renders it
conv = [{"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 21 C"}]}]
oconv = [{"role": "user", "content": "Weather in Paris?"},
         {"role": "assistant", "content": "Let me look.",
          "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
         {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny, 21 C"}]
rt = create(T, model=MODEL, max_tokens=16, temperature=0, messages=conv, tools=TOOLS)
ort = OT.chat.completions.create(model=MODEL, max_tokens=16, temperature=0, messages=oconv, tools=OTOOLS,
                                 extra_body={"enable_thinking": False})
check(rt.usage.input_tokens == ort.usage.prompt_tokens, f"tool round trip: same prompt as the OpenAI form ({rt.usage.input_tokens} vs {ort.usage.prompt_tokens})")
check(text_of(rt) == (ort.choices[0].message.content or ""), "tool round trip: same reply as the OpenAI form")
ctr = T.messages.count_tokens(model=MODEL, messages=conv, tools=TOOLS)
check(ctr.input_tokens == rt.usage.input_tokens, "tool round trip: count_tokens")
# tool_result content as blocks = as a string
conv_b = json.loads(json.dumps(conv))
conv_b[2]["content"][0]["content"] = [{"type": "text", "text": "Sunny, 21 C"}]
check(T.messages.count_tokens(model=MODEL, messages=conv_b, tools=TOOLS).input_tokens == ctr.input_tokens, "tool_result blocks = string")
# tool_choice tool: the named call, enforced by the grammar (tests/test_anthropic_tools.py goes further)
ft = create(T, model=MODEL, max_tokens=120, temperature=0, messages=[{"role": "user", "content": "Weather in Oslo?"}],
                       tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"})
uses = [b for b in ft.content if b.type == "tool_use"]
check(uses and ft.stop_reason == "tool_use" and uses[0].name == "get_weather" and isinstance(uses[0].input, dict) and
      isinstance(uses[0].input.get("city"), str), f"tool_choice tool: {ft}")
check(ft.usage.input_tokens > c1.input_tokens - 10, "tool_choice tool: prompt")
# tool_choice none: tools shown, calls not parsed
nn = create(T, model=MODEL, max_tokens=8, temperature=0, messages=tq, tools=TOOLS, tool_choice={"type": "none"})
check(all(b.type == "text" for b in nn.content), "tool_choice none: text only")

# ------------------------------------------------------------------------ errors
expect_error(lambda: create(anthropic.Anthropic(base_url=args.url, api_key="wrong", max_retries=0), 
    model=MODEL, max_tokens=4, messages=HELLO), anthropic.AuthenticationError, 401, ["API key"], "wrong x-api-key")
bearer = anthropic.Anthropic(base_url=args.url, auth_token=args.api_key, max_retries=0, timeout=60)
check(len(text_of(create(bearer, model=MODEL, max_tokens=4, temperature=0, messages=HELLO))) > 0, "auth by bearer header")
expect_error(lambda: create(A, model="claude-nope", max_tokens=4, messages=HELLO), anthropic.NotFoundError, 404,
             ["claude-nope"], "unknown model")
expect_error(lambda: create(A, model=MODEL, max_tokens=0, messages=HELLO), anthropic.BadRequestError, 400,
             ["max_tokens"], "max_tokens 0")
expect_error(lambda: create(A, model=MODEL, max_tokens=4, messages=[]), anthropic.BadRequestError, 400,
             ["messages"], "empty messages")
expect_error(lambda: create(A, model=MODEL, max_tokens=4, messages=[{"role": "system", "content": "x"}]),
             anthropic.BadRequestError, 400, ["role", "system"], "system role in messages")
expect_error(lambda: create(A, model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]),
    anthropic.BadRequestError, 400, ["image", "text only"], "image block")
expect_error(lambda: create(A, model=MODEL, max_tokens=4, messages=HELLO, top_p=2.0), anthropic.BadRequestError, 400,
             ["top_p"], "top_p out of range")
expect_error(lambda: create(A, model=MODEL, max_tokens=4, messages=HELLO, tools=[{"name": "f"}]),
             anthropic.BadRequestError, 400, ["tools[0]", "input_schema"], "tool without input_schema")
expect_error(lambda: create(A, model=MODEL, max_tokens=4, messages=HELLO,
                            tools=[{"name": "a<b>", "input_schema": {"type": "object"}}]),
             anthropic.BadRequestError, 400, ["tools[0]", "name"], "tool name with characters outside [A-Za-z0-9_-]")
expect_error(lambda: create(A, model=MODEL, max_tokens=4, messages=HELLO, tools=TOOLS,
                                       tool_choice={"type": "tool", "name": "other"}),
             anthropic.BadRequestError, 400, ["other"], "tool_choice names an unknown tool")
expect_error(lambda: create(A, model=MODEL, max_tokens=4, messages=HELLO, tool_choice={"type": "any"}),
             anthropic.BadRequestError, 400, ["tools"], "tool_choice any without tools")
expect_error(lambda: create(A, model=MODEL, max_tokens=4, messages=HELLO, tools=TOOLS, tool_choice={"type": "any"},
                                       thinking={"type": "enabled", "budget_tokens": 1024}),
             anthropic.BadRequestError, 400, ["thinking"], "tool_choice any with thinking")
expect_error(lambda: create(A, model=MODEL, max_tokens=4, messages=HELLO, stop_sequences="x"),
             anthropic.BadRequestError, 400, ["stop_sequences"], "stop_sequences not a list")
expect_error(lambda: create(A, model=MODEL, max_tokens=100000, messages=HELLO), anthropic.BadRequestError, 400,
             ["context length"], "max_tokens over the context")
for body, words, what in [
    ('{"model": "x"', ["malformed JSON"], "malformed JSON"),
    ({"messages": HELLO}, ["max_tokens"], "max_tokens required"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]},
     ["tool_use", "user"], "tool_use in a user message"),
    ({"max_tokens": 4, "messages": HELLO, "thinking": {"type": "sometimes"}}, ["thinking"], "bad thinking"),
]:
    st, b = raw("/v1/messages", body)
    j = json.loads(b)
    check(st == 400 and j.get("type") == "error" and j["error"]["type"] == "invalid_request_error"
          and all(w in j["error"]["message"] for w in words), f"raw {what}: {st} {b}")
st, b = raw("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": 5}]})
check(st == 400 and json.loads(b)["type"] == "error", f"count_tokens error: {st} {b}")

if failures:
    print(f"{len(failures)} check(s) failed", file=sys.stderr)
    sys.exit(1)
print("test_anthropic: all checks passed")
