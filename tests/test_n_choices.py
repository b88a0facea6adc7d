#!/usr/bin/env python3
"""n > 1 choices on chat and completions through the official `openai` client (run by
tests/cli_n_choices.sh against the default model; server A has fewer slots than the
largest n, so some sequences are queued instead of forked).

Every expectation is derived from the server itself: the engine draws sequence i with
seed + i, so choice i of an n-choice request must equal the reply of a one-choice
request with seed + i (text, finish_reason, logprobs' tokens). Checked: choices[i].index,
usage summed over the choices with the prompt counted once (completion tokens = the
sum of each choice's tokens counted by its logprobs, prompt tokens = those of an n = 1
request), streaming with per-choice deltas that add up to the non-streamed choices and a
finish_reason per index, include_usage, stop strings per choice, response_format
json_schema (every stopped choice validates with `jsonschema`), tool_choice "required"
(every choice's calls validate, streamed or not), logprobs on chat and completions, and
n outside [1, 16] refused with a 400 naming `n`."""
import argparse
import json
import sys

try:
    import jsonschema
    import openai
except ImportError as exc:
    print(f"FAIL: python module missing ({exc}); scripts/test.sh installs openai and jsonschema", file=sys.stderr)
    sys.exit(1)

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
args = ap.parse_args()
client = openai.OpenAI(base_url=args.url + "/v1", api_key="unused", max_retries=0, timeout=120)
MODEL = client.models.list().data[0].id
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr, flush=True)
    return cond


MSGS = [{"role": "user", "content": "Tell me something about rivers."}]
SEED = 1234


def chat(**kw):
    base = dict(model=MODEL, messages=MSGS, temperature=1.0, max_tokens=24, seed=SEED)
    base.update(kw)
    return client.chat.completions.create(**base)


def stream_chat(**kw):
    """Per index: (content, finish_reason, number of logprob entries); the usage chunk."""
    out, usage, roles = {}, None, {}
    for chunk in chat(stream=True, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            e = out.setdefault(ch.index, {"text": "", "finish": None, "lp": 0, "calls": {}})
            if ch.delta.role:
                roles[ch.index] = roles.get(ch.index, 0) + 1
            e["text"] += ch.delta.content or ""
            if ch.finish_reason:
                check(e["finish"] is None, f"index {ch.index}: one finish_reason")
                e["finish"] = ch.finish_reason
            if ch.logprobs and ch.logprobs.content:
                e["lp"] += len(ch.logprobs.content)
            for d in ch.delta.tool_calls or []:
                c = e["calls"].setdefault(d.index, {"name": None, "arguments": ""})
                if d.function and d.function.name:
                    c["name"] = d.function.name
                if d.function and d.function.arguments:
                    c["arguments"] += d.function.arguments
    for i, k in roles.items():
        check(k == 1, f"stream: index {i} sent its role once ({k})")
    return out, usage


def test_chat():
    N = 5
    r = chat(n=N, logprobs=True)
    check(len(r.choices) == N, f"chat n={N}: {len(r.choices)} choices")
    check([c.index for c in r.choices] == list(range(N)), f"choices[i].index = i: {[c.index for c in r.choices]}")
    counted = sum(len(c.logprobs.content) for c in r.choices)
    one = chat(logprobs=True)
    check(r.usage.prompt_tokens == one.usage.prompt_tokens, f"usage: the prompt counted once ({r.usage.prompt_tokens} "
          f"vs {one.usage.prompt_tokens})")
    check(r.usage.completion_tokens == counted, f"usage: completion tokens summed over the choices "
          f"({r.usage.completion_tokens} vs {counted})")
    check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "usage: total")
    texts = [c.message.content for c in r.choices]
    check(len(set(texts)) > 1, f"sampled choices differ: {texts}")
    for i, c in enumerate(r.choices):
        alone = chat(seed=SEED + i, logprobs=True).choices[0]
        check(c.message.content == alone.message.content and c.finish_reason == alone.finish_reason and
              [t.token for t in c.logprobs.content] == [t.token for t in alone.logprobs.content],
              f"choice {i} = the n = 1 reply with seed + {i}: {c.message.content!r} vs {alone.message.content!r}")
    # streamed: the same choices, interleaved per index
    s, usage = stream_chat(n=N, logprobs=True, stream_options={"include_usage": True})
    check(sorted(s) == list(range(N)), f"stream: indices {sorted(s)}")
    for i, c in enumerate(r.choices):
        e = s.get(i, {})
        check(e.get("text") == c.message.content and e.get("finish") == c.finish_reason,
              f"stream index {i}: {e.get('text')!r} / {e.get('finish')} = {c.message.content!r} / {c.finish_reason}")
        check(e.get("lp") == len(c.logprobs.content), f"stream index {i}: logprobs per token")
    check(usage is not None and usage.completion_tokens == r.usage.completion_tokens and
          usage.prompt_tokens == r.usage.prompt_tokens, f"stream include_usage: {usage} = {r.usage}")


def test_completions():
    kw = dict(model=MODEL, prompt="The river flows", temperature=1.0, max_tokens=16, seed=SEED, logprobs=2)
    r = client.completions.create(n=4, **kw)
    check([c.index for c in r.choices] == [0, 1, 2, 3], "completions: indices")
    check(r.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in r.choices), "completions: usage summed")
    for i, c in enumerate(r.choices):
        alone = client.completions.create(**dict(kw, seed=SEED + i)).choices[0]
        check(c.text == alone.text and c.logprobs.tokens == alone.logprobs.tokens,
              f"completions choice {i} = the n = 1 reply with seed + {i}")
    got = {}
    for chunk in client.completions.create(n=4, stream=True, **kw):
        for ch in chunk.choices:
            got[ch.index] = got.get(ch.index, "") + ch.text
    check(got == {i: c.text for i, c in enumerate(r.choices)}, f"completions stream per index: {got}")
    # echo: every choice starts with the prompt
    e = client.completions.create(n=2, echo=True, **dict(kw, logprobs=None))
    check(all(c.text.startswith("The river flows") for c in e.choices), "completions echo on every choice")


def test_stop():
    ref = chat(n=4, max_tokens=30)
    # a stop string taken from one choice's text: that choice ends before it, none contains it
    text = next((c.message.content for c in ref.choices if len(c.message.content) > 12), "")
    if not check(text, "stop: a reference choice with text"):
        return
    stop = text[6:9]
    r = chat(n=4, max_tokens=30, stop=[stop])
    for c in r.choices:
        check(stop not in c.message.content, f"stop {stop!r}: not in choice {c.index} ({c.message.content!r})")
    hit = [c for c in r.choices if c.finish_reason == "stop" and ref.choices[c.index].message.content.find(stop) >= 0]
    check(hit, "stop: a choice that contained the string stopped there")
    for c in hit:
        full = ref.choices[c.index].message.content
        check(c.message.content == full[:full.find(stop)], f"stop: choice {c.index} cut at the string")


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "n"], "additionalProperties": False}


def test_schema():
    rf = {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA, "strict": True}}
    r = chat(n=4, max_tokens=60, response_format=rf)
    stopped = 0
    for c in r.choices:
        if c.finish_reason == "stop":
            stopped += 1
            try:
                jsonschema.validate(json.loads(c.message.content), SCHEMA)
            except Exception as exc:  # noqa: BLE001
                check(False, f"schema choice {c.index}: {c.message.content!r} validates: {exc}")
        else:
            check(c.finish_reason == "length", f"schema choice {c.index}: finish {c.finish_reason}")
    check(stopped >= 3, f"schema: {stopped} of 4 choices stopped")
    check(len({c.message.content for c in r.choices}) > 1, "schema: the choices differ")
    s, _ = stream_chat(n=4, max_tokens=60, response_format=rf)
    for i, c in enumerate(r.choices):
        check(s.get(i, {}).get("text") == c.message.content, f"schema stream index {i} = non-streamed")


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"]}}}]


def test_tools():
    params = TOOLS[0]["function"]["parameters"]
    r = chat(n=3, max_tokens=120, tools=TOOLS, tool_choice="required")
    ids = set()
    for c in r.choices:
        check(c.finish_reason == "tool_calls", f"tools choice {c.index}: finish {c.finish_reason}")
        for tc in c.message.tool_calls or []:
            ids.add(tc.id)
            try:
                jsonschema.validate(json.loads(tc.function.arguments), params)
            except Exception as exc:  # noqa: BLE001
                check(False, f"tools choice {c.index}: {tc.function.arguments!r} validates: {exc}")
        check(c.message.tool_calls, f"tools choice {c.index}: has calls")
    check(len(ids) == sum(len(c.message.tool_calls or []) for c in r.choices), "tools: every call has its own id")
    s, _ = stream_chat(n=3, max_tokens=120, tools=TOOLS, tool_choice="required")
    for i, c in enumerate(r.choices):
        e = s.get(i, {})
        check(e.get("finish") == "tool_calls", f"tools stream index {i}: finish {e.get('finish')}")
        # the streamed arguments are the generated text, the whole ones re-serialized: compared parsed
        want = [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls or []]
        got = [(v["name"], json.loads(v["arguments"])) for _, v in sorted(e.get("calls", {}).items())]
        check(got == want, f"tools stream index {i}: {got} = {want}")


def test_limits():
    for n in (0, 17, -1):
        try:
            chat(n=n)
            check(False, f"n={n}: no error")
        except openai.BadRequestError as exc:
            body = exc.body if isinstance(exc.body, dict) else {}
            check(body.get("param") == "n" and "'n'" in body.get("message", ""), f"n={n}: 400 naming n ({body})")
    r = chat(n=16, max_tokens=4)
    check(len(r.choices) == 16 and [c.index for c in r.choices] == list(range(16)), "n=16: 16 choices")


for t in (test_chat, test_completions, test_stop, test_schema, test_tools, test_limits):
    try:
        t()
    except Exception as exc:  # noqa: BLE001
        check(False, f"{t.__name__} raised {type(exc).__name__}: {exc}")
if failures:
    print(f"test_n_choices: {len(failures)} failures", file=sys.stderr)
    sys.exit(1)
print("test_n_choices: ok")
