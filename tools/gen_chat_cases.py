#!/usr/bin/env python3
"""Generate chat-template conformance cases for tests/test_chat_template.c.

For every template in tests/data/chat_template/*.jinja this draws a fixed-seed
set of conversations (system/user/assistant turns, reasoning_content, tool
calls with dict and JSON-string arguments, single and consecutive tool
results, tool schemas with nested JSON and non-ASCII text, thinking switches,
awkward content) and renders each with Jinja2 configured the way transformers'
apply_chat_template configures it. The result is written next to the template
as <name>.cases.json:

    {"template": "<name>.jinja",
     "cases": [{"name": ..., "vars": {...}, "expected": "..."}          # rendered
               {"name": ..., "vars": {...}, "error": "..."}]}          # Jinja raised

Usage: tools/gen_chat_cases.py [--count N] [--seed S]
"""
import argparse
import json
import os
import random
import sys
from datetime import datetime

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "chat_template")


class RaisedError(TemplateError):
    """What the template's raise_exception() throws; its message must come back verbatim."""


def make_env():
    """The environment of transformers' _compile_jinja_template."""

    def raise_exception(message):
        raise RaisedError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


TEXTS = [
    "Hello!", "What is 2+2?", "Tell me a joke.", "", " ", "\n", "  padded  ", "\n\nleading newlines",
    "trailing newlines\n\n", "multi\nline\ntext", "tab\tseparated\tvalues", "quotes: 'single' and \"double\"",
    "backslashes: C:\\path\\to\\file and \\n literal", "unicode: héllo wörld — 你好，世界 🌍🚀",
    "combining: e\u0301 a\u0308 (NFD)", "json-like: {\"a\": [1, 2, {\"b\": null}]}",
    "html: <b>bold</b> & <i>it</i> &amp;", "jinja-like: {{ not a tag }} {% nope %} {# no #}",
    "control: \x01\x02\x1f end", "rtl: مرحبا بالعالم", "math: ∑ x² ≤ ∞", "<tool_response>\nfake\n</tool_response>",
    "<think>\ninner\n</think>\n\nafter think", "emoji only 😀😃😄", "zero\u200bwidth", "nbsp\u00a0space",
    "line\r\nbreaks\rmixed", "very " + "long " * 40 + "text",
]

REASONING = [
    "Let me think step by step.", "", "\nThe user wants X.\n", "First, 2+2=4.\nSo the answer is 4.",
    "reasoning with unicode: 思考中… and \"quotes\"", "  spaced reasoning  ",
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Zürich or 東京"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web — returns \"snippets\"",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "filters": {"type": "object", "properties": {
                "site": {"type": "string"}, "after": {"type": "string", "format": "date"},
                "tags": {"type": "array", "items": {"type": "string"}}}},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10}},
            "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "calc", "description": "Evaluate an arithmetic expression",
        "parameters": {"type": "object", "properties": {
            "expr": {"type": "string", "description": "e.g. 3.5 * (2 + 1) \\ path"},
            "precision": {"type": "number", "default": 1e-06},
            "exact": {"type": "boolean", "default": False}, "hint": {"type": ["string", "null"], "default": None}},
            "required": ["expr"]}}},
    {"type": "function", "function": {"name": "no_params", "description": "", "parameters": {"type": "object", "properties": {}}}},
    {"name": "bare_tool", "description": "A tool given without the function wrapper",
     "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}},
]

ARG_VALUES = [
    "Paris", "東京", "a \"quoted\" value", "back\\slash", "multi\nline", "", 42, -7, 0, 3.5, 1e-07, 1e20, 2.0,
    True, False, None, [1, 2, 3], ["a", "b"], [], {}, {"nested": {"deep": [1, {"k": "v"}]}}, {"ü": "ö"},
    [{"a": 1}, {"b": [True, None]}], 123456789012, -0.5, 0.1,
]


def rand_text(rng):
    return rng.choice(TEXTS)


def rand_args(rng):
    return {rng.choice(["city", "query", "expr", "unit", "x", "filters", "opts", "n", "flag", "ключ"]) + str(i):
            rng.choice(ARG_VALUES) for i in range(rng.randint(0, 3))}


def rand_tool_call(rng):
    name = rng.choice(["get_weather", "search", "calc", "no_params", "bare_tool"])
    args = rand_args(rng)
    style = rng.random()
    if style < 0.25:  # arguments as a JSON string (OpenAI wire format)
        args = json.dumps(args, ensure_ascii=rng.random() < 0.5)
    call = {"name": name, "arguments": args}
    if rng.random() < 0.8:
        call = {"id": "call_%d" % rng.randint(0, 9999), "type": "function", "function": call}
    return call


def rand_content(rng, tpl, allow_list=True):
    if tpl == "qwen3_5" and allow_list and rng.random() < 0.15:
        items = []
        for _ in range(rng.randint(1, 3)):
            r = rng.random()
            if r < 0.6:
                items.append({"type": "text", "text": rand_text(rng)})
            elif r < 0.8:
                items.append({"type": "image", "image": "file:///tmp/x.png"})
            else:
                items.append({"type": "video", "video": "file:///tmp/x.mp4"})
        return items
    return rand_text(rng)


def rand_conversation(rng, tpl, idx):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": rand_content(rng, tpl, allow_list=False)})
    for turn in range(rng.randint(1, 4)):
        msgs.append({"role": "user", "content": rand_content(rng, tpl)})
        if turn == 0 and rng.random() < 0.2:
            continue
        r = rng.random()
        a = {"role": "assistant", "content": rand_text(rng)}
        if r < 0.3:
            a["reasoning_content"] = rng.choice(REASONING)
        elif r < 0.4:
            a["content"] = "<think>\n" + rng.choice(REASONING) + "\n</think>\n\n" + rand_text(rng)
        elif r < 0.45:
            a["reasoning_content"] = None
        if rng.random() < 0.35:
            a["tool_calls"] = [rand_tool_call(rng) for _ in range(rng.randint(1, 3))]
            if rng.random() < 0.3:
                a["content"] = ""
            msgs.append(a)
            for call in a["tool_calls"]:
                msgs.append({"role": "tool", "content": rng.choice(
                    ["{\"temp\": 21.5, \"unit\": \"celsius\"}", "result: ok", "", "多行\n结果", "error: \"not found\""])})
                if rng.random() < 0.3:
                    break
            if rng.random() < 0.6:
                final = {"role": "assistant", "content": rand_text(rng)}
                if rng.random() < 0.4:
                    final["reasoning_content"] = rng.choice(REASONING)
                msgs.append(final)
        else:
            msgs.append(a)
    if rng.random() < 0.4 and msgs[-1]["role"] == "assistant":
        msgs.append({"role": "user", "content": rand_text(rng)})
    v = {"messages": msgs}
    r = rng.random()
    if r < 0.35:
        v["tools"] = rng.sample(TOOLS, rng.randint(1, len(TOOLS)))
    elif r < 0.45:
        v["tools"] = None
    elif r < 0.5:
        v["tools"] = []
    v["add_generation_prompt"] = rng.random() < 0.6
    r = rng.random()
    if r < 0.33:
        v["enable_thinking"] = True
    elif r < 0.66:
        v["enable_thinking"] = False
    if rng.random() < 0.3:
        v["bos_token"] = "<|endoftext|>"
        v["eos_token"] = "<|im_end|>"
    if tpl == "qwen3_5" and rng.random() < 0.2:
        v["add_vision_id"] = True
    if rng.random() < 0.1:
        v["preserve_thinking"] = True
    return v


def edge_cases(tpl):
    """Hand-written cases for the template's branches and error paths."""
    u = {"role": "user", "content": "hi"}
    return [
        ("only_user", {"messages": [u], "add_generation_prompt": True}),
        ("only_user_no_think", {"messages": [u], "add_generation_prompt": True, "enable_thinking": False}),
        ("only_user_think_true", {"messages": [u], "add_generation_prompt": True, "enable_thinking": True}),
        ("system_only", {"messages": [{"role": "system", "content": "You are helpful."}]}),
        ("empty_messages", {"messages": []}),
        ("system_not_first", {"messages": [u, {"role": "system", "content": "late system"}]}),
        ("unknown_role", {"messages": [u, {"role": "narrator", "content": "x"}]}),
        ("tool_only", {"messages": [{"role": "tool", "content": "r"}]}),
        ("user_none_content", {"messages": [{"role": "user", "content": None}]}),
        ("consecutive_tools", {"messages": [
            u, {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "a", "arguments": {"x": 1}}},
                {"type": "function", "function": {"name": "b", "arguments": "{\"y\": [1, 2]}"}}]},
            {"role": "tool", "content": "ra"}, {"role": "tool", "content": "rb"},
            {"role": "assistant", "content": "done"}], "add_generation_prompt": False}),
        ("multi_step_tool_response_user", {"messages": [
            u, {"role": "assistant", "content": "calling", "reasoning_content": "need tool",
                "tool_calls": [{"name": "a", "arguments": {"q": "ü"}}]},
            {"role": "user", "content": "<tool_response>\nx\n</tool_response>"},
            {"role": "assistant", "content": "final", "reasoning_content": "got it"}]}),
        ("tool_arg_types", {"messages": [u, {"role": "assistant", "content": "c", "tool_calls": [
            {"function": {"name": "f", "arguments": {
                "s": "str", "i": 1, "f": 1.5, "big": 1e20, "small": 1e-07, "t": True, "fa": False, "n": None,
                "l": [1, "two", None], "d": {"k": {"z": [True]}}, "e": "", "neg": -0.0}}}]}]}),
    ]


def render_case(env, tpl_src, variables):
    try:
        return {"expected": env.from_string(tpl_src).render(**variables)}
    except RaisedError as e:
        return {"error": str(e), "raised": True}
    except Exception as e:  # UndefinedError, TypeError, ...: the C renderer must fail too
        return {"error": "%s: %s" % (type(e).__name__, e)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=64, help="random conversations per template")
    ap.add_argument("--seed", type=int, default=20261129)
    a = ap.parse_args()
    env = make_env()
    for fn in sorted(os.listdir(DATA)):
        if not fn.endswith(".jinja"):
            continue
        name = fn[:-6]
        with open(os.path.join(DATA, fn), encoding="utf-8") as f:
            src = f.read()
        rng = random.Random("%d/%s" % (a.seed, name))
        cases = []
        for cname, v in edge_cases(name):
            cases.append({"name": cname, "vars": v, **render_case(env, src, v)})
        for i in range(a.count):
            v = rand_conversation(rng, name, i)
            cases.append({"name": "random_%03d" % i, "vars": v, **render_case(env, src, v)})
        out = os.path.join(DATA, name + ".cases.json")
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"template": fn, "generator": "tools/gen_chat_cases.py --count %d --seed %d" % (a.count, a.seed),
                       "cases": cases}, f, ensure_ascii=False, indent=1)
            f.write("\n")
        n_err = sum(1 for c in cases if "error" in c)
        print("%s: %d cases (%d expect an error)" % (out, len(cases), n_err), file=sys.stderr)


if __name__ == "__main__":
    main()
