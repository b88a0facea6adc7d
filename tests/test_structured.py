#!/usr/bin/env python3
"""Structured outputs and enforced tool calls through the official `openai` client
(run by tests/cli_server.sh against its servers A and B; see tests/test_server.py):

- for a range of schemas, on chat and completions, with several seeds: every reply
  that stops parses and validates (`jsonschema`); replies cut by max_tokens say
  "length"; the grammar closes the JSON before max_tokens where it can;
- response_format json_object gives an object; with thinking on (server B's Qwen3.5
  template opens <think>) the constraint starts after the reasoning;
- tool_choice "required" and a named function produce calls whose arguments validate
  against the tool's parameters, streamed or not, in hermes JSON (A's Qwen3 template)
  and the Qwen3.5 XML form (B), with parallel_tool_calls false giving one call;
- malformed schemas, unknown keywords, oversized schemas and bad tool definitions get a
  400 whose message names what is wrong."""
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
ap.add_argument("--api-key", required=True)
ap.add_argument("--tools-url", required=True)
args = ap.parse_args()
A = openai.OpenAI(base_url=args.url + "/v1", api_key=args.api_key, max_retries=0, timeout=120)
B = openai.OpenAI(base_url=args.tools_url + "/v1", api_key="unused", max_retries=0, timeout=120)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr, flush=True)
    return cond


SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "format": "email"}},
        "required": ["name", "age"], "additionalProperties": False},
    "list": {"type": "array", "items": {"type": "number", "minimum": -10, "maximum": 10}, "minItems": 1, "maxItems": 4},
    "enum_const": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                                    "v": {"const": 2}, "ok": {"type": "boolean"}},
                   "required": ["color", "v", "ok"]},
    "nullable_anyof": {"type": "object", "properties": {
        "x": {"type": ["integer", "null"], "exclusiveMinimum": 0, "exclusiveMaximum": 50},
        "y": {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}]}},
        "required": ["x", "y"]},
    "recursive": {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer", "minimum": 0, "maximum": 9},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["v", "kids"]}},
        "$ref": "#/$defs/node"},
    "formats": {"type": "object", "properties": {"d": {"type": "string", "format": "date"},
                                                 "t": {"type": "string", "format": "date-time"},
                                                 "u": {"type": "string", "format": "uuid"}},
                "required": ["d", "t", "u"]},
    "unicode_str": {"type": "object", "properties": {"s": {"type": "string", "minLength": 3, "maxLength": 8}},
                    "required": ["s"]},
    "map": {"type": "object", "additionalProperties": {"type": "integer", "minimum": -3, "maximum": 3}},
    "pattern": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
                                                 "word": {"type": "string", "pattern": "(cat|dog)s?"}},
                "required": ["code", "word"]},
    # oneOf told apart by a discriminator: jsonschema checks that exactly one branch matches
    "oneof_tagged": {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0, "maximum": 9}},
         "required": ["kind", "r"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "box"}, "w": {"type": "integer", "minimum": 0, "maximum": 9},
                                          "h": {"type": "integer", "minimum": 0, "maximum": 9}},
         "required": ["kind", "w", "h"], "additionalProperties": False},
        {"type": "null"}]},
}


def rf(schema):
    return {"type": "json_schema", "json_schema": {"name": "out", "strict": True, "schema": schema}}


def test_schemas():
    stops = 0
    for name, schema in SCHEMAS.items():
        for seed in range(3):
            r = A.chat.completions.create(model="qdelta-tiny", messages=[{"role": "user", "content": f"Some {name} JSON"}],
                                          max_tokens=160, temperature=1.0, seed=seed, response_format=rf(schema))
            c = r.choices[0]
            if c.finish_reason == "stop":
                stops += 1
                try:
                    jsonschema.validate(json.loads(c.message.content), schema)
                except Exception as exc:  # noqa: BLE001 - the message is the point
                    check(False, f"{name} seed {seed}: a stopped reply validates: {c.message.content!r}: {exc}")
            else:
                check(c.finish_reason == "length", f"{name} seed {seed}: finish_reason {c.finish_reason}")
        # completions take response_format too
        r = A.completions.create(model="qdelta-tiny", prompt="JSON:", max_tokens=160, temperature=0.7, seed=1,
                                 extra_body={"response_format": rf(schema)})
        if r.choices[0].finish_reason == "stop":
            stops += 1
            try:
                jsonschema.validate(json.loads(r.choices[0].text), schema)
            except Exception as exc:  # noqa: BLE001
                check(False, f"completions {name}: a stopped reply validates: {r.choices[0].text!r}: {exc}")
    # the grammar forces a close before max_tokens, so nearly every reply stops
    check(stops >= len(SCHEMAS) * 3, f"replies that stop: {stops} of {len(SCHEMAS) * 4}")


def test_budget_and_object():
    # a budget too small for any value of the schema: cut, and it says so
    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 40}}, "required": ["a"]}
    r = A.chat.completions.create(model="qdelta-tiny", messages=[{"role": "user", "content": "x"}], max_tokens=6,
                                  temperature=0.8, seed=2, response_format=rf(schema))
    check(r.choices[0].finish_reason == "length", f"cut by max_tokens -> length ({r.choices[0].finish_reason})")
    # an unbounded array with a budget that leaves room: closed in time
    schema = {"type": "array", "items": {"type": "integer"}}
    for seed in range(3):
        r = A.chat.completions.create(model="qdelta-tiny", messages=[{"role": "user", "content": "numbers"}],
                                      max_tokens=24, temperature=1.0, seed=seed, response_format=rf(schema),
                                      extra_body={"ignore_eos": False})
        c = r.choices[0]
        ok = c.finish_reason == "stop" and isinstance(json.loads(c.message.content), list)
        check(ok, f"seed {seed}: closed before max_tokens 24: {c.finish_reason} {c.message.content!r}")
    r = A.chat.completions.create(model="qdelta-tiny", messages=[{"role": "user", "content": "An object"}], max_tokens=60,
                                  temperature=0.9, seed=4, response_format={"type": "json_object"})
    if check(r.choices[0].finish_reason == "stop", f"json_object stops ({r.choices[0].finish_reason})"):
        check(isinstance(json.loads(r.choices[0].message.content), dict), f"json_object: {r.choices[0].message.content!r}")
    # thinking on: the reasoning is free text, the answer after </think> follows the schema
    tm = B.models.list().data[0].id
    schema = SCHEMAS["enum_const"]
    r = B.chat.completions.create(model=tm, messages=[{"role": "user", "content": "Pick a colour"}], max_tokens=200,
                                  temperature=0.8, seed=5, response_format=rf(schema),
                                  extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    c = r.choices[0]
    # EOS is refused inside the reasoning and </think> forced in time: it stops with an answer
    check(c.finish_reason == "stop", f"thinking on: the reply stops ({c.finish_reason})")
    try:
        jsonschema.validate(json.loads(c.message.content), schema)
    except Exception as exc:  # noqa: BLE001
        check(False, f"thinking on: the content after the reasoning validates: {c.message}: {exc}")
    rc = getattr(c.message, "reasoning_content", None) or (c.message.model_extra or {}).get("reasoning_content")
    check(rc, f"thinking on: the reasoning is there ({c.message})")


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                         "unit": {"enum": ["c", "f"]}},
        "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def validate_calls(calls, what, only=None, most=None):
    if not check(calls, f"{what}: tool calls present"):
        return
    if most is not None:
        check(len(calls) <= most, f"{what}: at most {most} call(s), got {len(calls)}")
    for tc in calls:
        name, argtext = tc["name"], tc["arguments"]
        check(tc.get("id"), f"{what}: the call has an id")
        check(name in PARAMS and (only is None or name == only), f"{what}: function {name!r}")
        try:
            jsonschema.validate(json.loads(argtext), PARAMS.get(name, {}))
        except Exception as exc:  # noqa: BLE001
            check(False, f"{what}: arguments {argtext!r} validate: {exc}")


STREAM_SHAPE = {"first_with_name": 0, "calls": 0, "arg_deltas": 0}


def collect_stream(client, **kw):
    calls, finish = {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        finish = ch.finish_reason or finish
        for d in ch.delta.tool_calls or []:
            if d.index not in calls:
                STREAM_SHAPE["calls"] += 1
                STREAM_SHAPE["first_with_name"] += bool(d.id and d.function and d.function.name)
            if d.function and d.function.arguments:
                STREAM_SHAPE["arg_deltas"] += 1
            e = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            if d.id:
                e["id"] = d.id
            if d.function and d.function.name:
                e["name"] = d.function.name
            if d.function and d.function.arguments:
                e["arguments"] += d.function.arguments
    return [calls[k] for k in sorted(calls)], finish


def test_tool_choice():
    validated = 0
    for label, client, model, extra in (("hermes", A, "qdelta-tiny", {}),
                                        ("xml", B, B.models.list().data[0].id, {"chat_template_kwargs": {"enable_thinking": False}})):
        msgs = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
        for choice, only in (("required", None), ({"type": "function", "function": {"name": "add"}}, "add")):
            for seed in range(2):
                kw = dict(model=model, messages=msgs, tools=TOOLS, tool_choice=choice, max_tokens=200, temperature=0.8,
                          seed=seed, extra_body=extra)
                r = client.chat.completions.create(**kw)
                c = r.choices[0]
                what = f"{label} {only or 'required'} seed {seed}"
                if c.finish_reason == "length":
                    continue
                check(c.finish_reason == "tool_calls", f"{what}: finish_reason {c.finish_reason} ({c.message})")
                validate_calls([{"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
                                for t in c.message.tool_calls or []], what, only)
                validated += 1
                calls, finish = collect_stream(client, **kw)
                if finish != "length":
                    check(finish == "tool_calls", f"{what} streamed: finish_reason {finish}")
                    validate_calls(calls, what + " streamed", only)
        r = client.chat.completions.create(model=model, messages=msgs, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=200, temperature=0.8, seed=7,
                                           extra_body=extra)
        if r.choices[0].finish_reason != "length":
            validate_calls([{"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
                            for t in r.choices[0].message.tool_calls or []], f"{label} parallel_tool_calls false", most=1)
    check(validated >= 6, f"tool calls that finished and were validated: {validated} of 8")
    # streamed as they are generated: id and name in each call's first delta, arguments in pieces
    st = STREAM_SHAPE
    check(st["calls"] > 0 and st["first_with_name"] == st["calls"], f"streamed calls open with id and name: {st}")
    check(st["arg_deltas"] > 3 * st["calls"], f"arguments arrive in pieces: {st}")


def expect_400(what, needle, **kw):
    try:
        kw.setdefault("model", "qdelta-tiny")
        kw.setdefault("messages", [{"role": "user", "content": "x"}])
        kw.setdefault("max_tokens", 4)
        A.chat.completions.create(**kw)
        check(False, f"{what}: expected a 400")
    except openai.BadRequestError as exc:
        msg = str(exc)
        check(needle in msg, f"{what}: the message names {needle!r}: {msg}")
    except openai.APIStatusError as exc:
        check(False, f"{what}: status {exc.status_code}, expected 400")


def test_errors():
    expect_400("unknown keyword", "unsupported keyword 'patternProperties' at #/properties/a",
               response_format=rf({"type": "object", "properties": {"a": {"type": "object", "patternProperties": {}}}}))
    expect_400("unknown keyword at the root", "unsupported keyword 'not' at #", response_format=rf({"not": {}}))
    expect_400("oneOf whose branches overlap", "'oneOf' at #/properties/v: branches 0 and 1 may both match",
               response_format=rf({"type": "object", "properties": {"v": {"oneOf": [
                   {"type": "string", "maxLength": 4}, {"type": "string", "pattern": "^a"}]}}}))
    expect_400("malformed schema: bad type", "unknown type \"strng\"", response_format=rf({"type": "strng"}))
    expect_400("malformed schema: minItems", "'minItems' at #", response_format=rf({"type": "array", "minItems": "2"}))
    expect_400("malformed schema: $ref", "#/$defs/nope", response_format=rf({"$ref": "#/$defs/nope"}))
    expect_400("malformed schema: bounds", "meets its bounds",
               response_format=rf({"type": "integer", "minimum": 3, "maximum": 1}))
    expect_400("schema not an object", "json_schema.schema",
               response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": 3}})
    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "d" * 100} for i in range(800)}}
    expect_400("oversized schema", "over the limit", response_format=rf(big))
    expect_400("huge maxLength", "'maxLength' 1000000", response_format=rf({"type": "string", "maxLength": 1000000}))
    expect_400("response_format type", "is not one of text, json_object, json_schema", response_format={"type": "yaml"})
    expect_400("tool without a name", "tools[0].function.name", tools=[{"type": "function", "function": {}}])
    expect_400("tool parameters not a schema", "tools[1].function.parameters",
               tools=[TOOLS[0], {"type": "function", "function": {"name": "f", "parameters": [1]}}])
    expect_400("tool of another type", "tools[0] must be an object of type \"function\"",
               tools=[{"type": "retrieval"}])
    expect_400("tool schema with an unknown keyword", "unsupported keyword 'if'",
               tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "if": {}}}}],
               tool_choice="required")
    expect_400("named function missing", "'nope', which is not in 'tools'", tools=TOOLS,
               tool_choice={"type": "function", "function": {"name": "nope"}})
    expect_400("tool_choice value", "'tool_choice' \"always\"", tools=TOOLS, tool_choice="always")
    expect_400("required without tools", "needs a non-empty 'tools'", tool_choice="required")
    # tool_choice "none": no constraint, no parsing, a plain reply
    r = A.chat.completions.create(model="qdelta-tiny", messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
                                  tool_choice="none", max_tokens=8, temperature=0)
    check(not r.choices[0].message.tool_calls, "tool_choice none: no calls")


for t in (test_schemas, test_budget_and_object, test_tool_choice, test_errors):
    n0 = len(failures)
    t()
    print(f"{'ok  ' if len(failures) == n0 else 'FAIL'} {t.__name__}", flush=True)
print(f"test_structured.py: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
