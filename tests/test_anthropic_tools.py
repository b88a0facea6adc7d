#!/usr/bin/env python3
"""Anthropic tool use through the official `anthropic` client (run by
tests/cli_anthropic.sh against its servers: --url, the default model's Qwen3 template,
hermes JSON calls; --tools-url, the Qwen3.5 template, XML calls):

- tool_choice {"type": "any"} and {"type": "tool", "name"} are enforced by the grammar:
  with sampling (temperature 0.9) every reply, streamed or not, is tool_use blocks only,
  stop_reason "tool_use", the name among the tools (the named one for `tool`), the
  input validating against input_schema (`jsonschema`); disable_parallel_tool_use
  gives one block;
- streamed tool input arrives incrementally: a call's arguments come as several
  input_json_delta events (not one at the end), which the client's stream helper
  accumulates; their concatenation parses to the final message's input, which equals
  the non-streamed reply's for the same greedy request."""
import argparse
import json
import sys
import urllib.request

try:
    import anthropic
    import jsonschema
except ImportError as e:
    print(f"FAIL: {e} (python3 -m pip install anthropic jsonschema)", file=sys.stderr)
    sys.exit(1)

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--api-key", required=True)
ap.add_argument("--tools-url", required=True)
args = ap.parse_args()
A = anthropic.Anthropic(base_url=args.url, api_key=args.api_key, max_retries=0, timeout=120)
T = anthropic.Anthropic(base_url=args.tools_url, api_key="unused", max_retries=0, timeout=120)
req = urllib.request.Request(args.url + "/v1/models", headers={"Authorization": "Bearer " + args.api_key})
MODEL = json.loads(urllib.request.urlopen(req, timeout=30).read())["data"][0]["id"]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr, flush=True)
    return cond


TOOLS = [
    {"name": "get_weather", "description": "Weather of a city for some days",
     "input_schema": {"type": "object", "properties": {
         "city": {"type": "string", "maxLength": 24},
         "days": {"type": "integer", "minimum": 1, "maximum": 7},
         "unit": {"enum": ["c", "f"]}}, "required": ["city", "days"], "additionalProperties": False}},
    {"name": "add", "description": "Add two numbers",
     "input_schema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                      "required": ["a", "b"]}},
]
SCHEMA = {t["name"]: t["input_schema"] for t in TOOLS}
MSGS = [{"role": "user", "content": "What is the weather in Oslo this week? And what is 2 + 40?"}]


def body(kw):
    """This SDK version has no temperature argument (the API takes it): it goes through extra_body."""
    kw = dict(kw)
    if "temperature" in kw:
        kw["extra_body"] = {"temperature": kw.pop("temperature")}
    return kw


def validate_uses(msg, what, only=None, most=None):
    uses = [b for b in msg.content if b.type == "tool_use"]
    others = [b for b in msg.content if b.type != "tool_use" and not (b.type == "text" and not b.text)]
    check(msg.stop_reason == "tool_use", f"{what}: stop_reason {msg.stop_reason}")
    check(uses and not others, f"{what}: tool_use blocks only ({msg.content})")
    if most is not None:
        check(len(uses) <= most, f"{what}: at most {most} tool_use block(s), got {len(uses)}")
    for u in uses:
        check(u.id, f"{what}: the block has an id")
        check(u.name in SCHEMA and (only is None or u.name == only), f"{what}: tool {u.name!r}")
        try:
            jsonschema.validate(u.input, SCHEMA.get(u.name, {}))
        except Exception as exc:  # noqa: BLE001
            check(False, f"{what}: input {u.input!r} validates against input_schema: {exc}")
    return uses


def streamed(client, **kw):
    """The final message of a stream, and per tool_use block index the partial_json pieces."""
    pieces = {}
    with client.messages.stream(**body(kw)) as st:
        for ev in st:
            if ev.type == "content_block_delta" and ev.delta.type == "input_json_delta":
                pieces.setdefault(ev.index, []).append(ev.delta.partial_json)
        final = st.get_final_message()
    return final, pieces


def test_forced():
    n = 0
    for label, client in (("hermes", A), ("xml", T)):
        for choice, only in (({"type": "any"}, None), ({"type": "tool", "name": "get_weather"}, "get_weather"),
                             ({"type": "tool", "name": "add"}, "add")):
            for k in range(2):
                kw = dict(model=MODEL, max_tokens=160, temperature=0.9, messages=MSGS, tools=TOOLS, tool_choice=choice)
                what = f"{label} {choice} #{k}"
                m = client.messages.create(**body(kw))
                n += bool(validate_uses(m, what, only, most=1 if only else None))
                f, pieces = streamed(client, **kw)
                n += bool(validate_uses(f, what + " streamed", only, most=1 if only else None))
                for i, b in enumerate(f.content):
                    if b.type == "tool_use":
                        joined = "".join(pieces.get(i, []))
                        check(joined and json.loads(joined) == b.input,
                              f"{what} streamed: the partial_json pieces {pieces.get(i)} concatenate to the input {b.input}")
        one = client.messages.create(**body(dict(model=MODEL, max_tokens=160, temperature=0.9, messages=MSGS, tools=TOOLS,
                                                 tool_choice={"type": "any", "disable_parallel_tool_use": True})))
        validate_uses(one, f"{label} any, disable_parallel_tool_use", most=1)
    check(n == 24, f"forced tool calls that validated: {n} of 24")


def test_incremental():
    """Greedy: the streamed input equals the non-streamed one, and arrives in pieces."""
    for label, client in (("hermes", A), ("xml", T)):
        kw = dict(model=MODEL, max_tokens=160, temperature=0, messages=MSGS, tools=TOOLS,
                  tool_choice={"type": "tool", "name": "get_weather"})
        m = client.messages.create(**body(kw))
        f, pieces = streamed(client, **kw)
        want = [(b.name, b.input) for b in m.content if b.type == "tool_use"]
        got = [(b.name, b.input) for b in f.content if b.type == "tool_use"]
        check(want and got == want, f"{label}: streamed tool_use = non-streamed ({got} vs {want})")
        idx = [i for i, b in enumerate(f.content) if b.type == "tool_use"]
        if idx:
            check(len(pieces.get(idx[0], [])) >= 3,
                  f"{label}: the input arrives as it is generated: {len(pieces.get(idx[0], []))} input_json_delta events "
                  f"{pieces.get(idx[0])}")
    # raw event order: content_block_start (tool_use, empty input) before its first delta, a stop after the last
    with A.messages.stream(**body(dict(model=MODEL, max_tokens=160, temperature=0, messages=MSGS, tools=TOOLS,
                                       tool_choice={"type": "any"}))) as st:
        order = []
        for ev in st:
            if ev.type == "content_block_start":
                order.append(("start", ev.index, ev.content_block.type))
                if ev.content_block.type == "tool_use":
                    check(ev.content_block.input == {} and ev.content_block.name in SCHEMA, f"tool_use start: {ev}")
            elif ev.type == "content_block_delta":
                order.append(("delta", ev.index, ev.delta.type))
            elif ev.type == "content_block_stop":
                order.append(("stop", ev.index, None))
        opened = set()
        for kind, i, _ in order:
            if kind == "start":
                check(i not in opened, f"block {i} opened once")
                opened.add(i)
            else:
                check(i in opened, f"{kind} of block {i} after its start ({order})")


for t in (test_forced, test_incremental):
    try:
        t()
    except Exception as exc:  # noqa: BLE001
        check(False, f"{t.__name__} raised {type(exc).__name__}: {exc}")
if failures:
    print(f"test_anthropic_tools: {len(failures)} failures", file=sys.stderr)
    sys.exit(1)
print("test_anthropic_tools: ok")
