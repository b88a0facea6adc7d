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
    if tpl.startswith("qwen3_5") and allow_list and rng.random() < 0.15:
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
    if tpl.startswith("qwen3_5") and rng.random() < 0.2:
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
        ("assistant_null_content_tool_calls", {"messages": [
            u, {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 3}"}], "add_generation_prompt": True}),
        ("assistant_missing_content", {"messages": [u, {"role": "assistant", "reasoning_content": "r"}]}),
        ("content_list_text_only", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"text": "b"}]}]}),
        ("long_history", {"messages": [m for k in range(40) for m in (
            {"role": "user", "content": "question %d" % k},
            {"role": "assistant", "content": "answer %d" % k, "reasoning_content": "thought %d" % k})],
            "add_generation_prompt": True}),
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


# Small templates, one construct each, checked against Jinja2 the same way.
M = {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "Hi \"there\""},
                  {"role": "assistant", "content": "yo", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}],
     "d": {"b": 2, "a": 1, "nested": {"x": [1, 2.5, None, True, "s"]}}, "s": "  Hello, World  ", "n": 7,
     "f": 2.5, "l": [3, 1, 2], "words": ["b", "a", "c"], "u": "ünïcödé ßtraße 東京", "e": "", "none": None,
     "t": True, "fl": False, "big": 12345678901234, "neg": -3, "items": [{"k": "x", "v": 1}, {"k": "y", "v": 2}, {"k": "z"}]}
SNIPPETS = [
    # output and literals
    ("{{ 'a' }}{{ \"b\" }}{{ 1 }}{{ 1.5 }}{{ true }}{{ True }}{{ none }}{{ None }}", {}),
    ("{{ 'ab' 'cd' }}|{{ '\\n\\t\\\\\\'\\x41\\u00e9\\U0001F600\\101' }}", {}),
    ("{{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1_000_000 }} {{ 0.5e1 }} {{ 2E3 }} {{ 1_0.2_5 }} {{ l.0 }} {{ [[1, [2, 3]]].0.1.1 }} {{ 00 }}", {"l": [4]}),
    ("{{ 03 }}", {}),
    ("{{ [1, zz, 3] }} {{ {'a': zz} }} {{ zz is callable }} {{ none | string }}", {}),
    ("{{ zz | int }}", {}),
    ("{{ zz | indent }}", {}),
    ("{{ zz | selectattr('k', 'nosuchtest') | list }} {{ [] | map(bogus=1) | list }}", {}),
    ("{{ 0.1 }} {{ 1e20 }} {{ 1e16 }} {{ 1e15 }} {{ 1.0 }} {{ 1e-5 }} {{ 0.0001 }} {{ 123.456 }} {{ 1_000 }} {{ 2.5e-3 }}", {}),
    ("{{ f }} {{ big }} {{ neg }} {{ none }} {{ t }} {{ fl }} {{ l }} {{ d }} {{ words }}", M),
    ("{{ [1, 'a', none, true, 1.5, [2], {'k': 'v'}] }} {{ (1, 2) }} {{ (1,) }} {{ () }} {{ {} }}", {}),
    ("{{ \"it's\" }} {{ [\"it's\", 'say \"hi\"', 'both \\' \"'] }} {{ ['\\n\\t\\x01\\\\', 'é'] }}", {}),
    ("{{ undefined_var }}|{{ d.missing }}|{{ l[10] }}|{{ d['missing'] }}|{{ none.x }}", M),
    # arithmetic
    ("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}", {}),
    ("{{ 1 + 2 * 3 - 4 }} {{ (1 + 2) * 3 }} {{ -n }} {{ +n }} {{ n - -1 }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1] + [2] }} {{ 1 + 1.5 }} {{ true + 1 }}", M),
    ("{{ 'a' ~ 1 ~ none ~ undefined_var ~ [1] ~ 2.0 }}", {}),
    # comparisons and logic
    ("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 != 2 }} {{ 2 >= 2 }} {{ true == 1 }}", {}),
    ("{{ 'a' in 'cat' }} {{ 'x' not in 'cat' }} {{ 2 in l }} {{ 'b' in d }} {{ 'q' in undefined_var }} {{ '' in 'x' }}", M),
    ("{{ n and 'yes' }}|{{ e and 'yes' }}|{{ e or 'fallback' }}|{{ none or l }}|{{ not n }}|{{ not e }}|{{ not undefined_var }}", M),
    ("{{ 'a' if t else 'b' }}|{{ 'a' if fl else 'b' }}|{{ 'a' if fl }}|{{ 1 if none is none else 2 }}", M),
    # attribute / item / slice
    ("{{ messages[0].role }} {{ messages[-1]['content'] }} {{ messages[1].content }} {{ d.nested.x[1] }} {{ d['nested']['x'][-1] }} {{ l.0 }}", M),
    ("{{ l[::-1] }} {{ l[1:] }} {{ l[:-1] }} {{ l[::2] }} {{ l[5:] }} {{ l[-10:2] }} {{ l[2:0:-1] }} {{ words[::-2] }}", M),
    ("{{ u[::-1] }}|{{ u[1:4] }}|{{ u[-3:] }}|{{ u[0] }}|{{ u[-1] }}|{{ s[2:7] }}", M),
    # filters
    ("{{ s | trim }}|{{ s | length }}|{{ u | length }}|{{ l | length }}|{{ d | length }}|{{ undefined_var | length }}|{{ l | count }}", M),
    ("{{ s | upper }}|{{ s | lower }}|{{ 'hello wORLD-foo(bar)' | title }}|{{ 'hELLO world' | capitalize }}|{{ u | upper }}|{{ u | lower }}", M),
    ("{{ undefined_var | default('dflt') }}|{{ e | default('dflt') }}|{{ e | default('dflt', true) }}|{{ none | default('x') }}|{{ n | d(3) }}", M),
    ("{{ l | first }} {{ l | last }} {{ words | join(', ') }} {{ l | join }} {{ items | map(attribute='k') | join('-') }} {{ u | first }}", M),
    ("{{ d | items | list }} {{ d.items() | list }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }} {{ d.get('zz', 'no') }} {{ d.get('zz') }}", M),
    ("{{ 'a-b-a' | replace('a', 'X') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ n | string }} {{ f | int }} {{ '42' | int }} {{ 'x' | int(5) }} {{ '3.7' | float }} {{ n | float }} {{ '3.9' | int }}", M),
    ("{{ l | reverse | list }} {{ 'abc' | reverse }} {{ l | list }} {{ 'ab' | list }} {{ -3 | abs }} {{ neg | abs }} {{ l | sum }} {{ l | max }} {{ l | min }} {{ items | sum(attribute='v') }}", M),
    ("{{ d | tojson }}|{{ l | tojson }}|{{ u | tojson }}|{{ 'q\"\\\\\\n\\t\\x01\\x7f' | tojson }}|{{ none | tojson }}|{{ f | tojson }}|{{ 1e20 | tojson }}|{{ t | tojson }}", M),
    ("{{ d | tojson(indent=2) }}|{{ l | tojson(indent=2) }}|{{ {} | tojson(indent=2) }}|{{ d | tojson(sort_keys=true) }}|{{ d | tojson(separators=(',', ':')) }}|{{ u | tojson(ensure_ascii=true) }}", M),
    ("{{ messages | tojson }}", M),
    ("{{ '<a href=\"x\">&\\'</a>' | e }} {{ s | safe }} {{ [1,2] | safe }} {{ d | string }}", M),
    ("{{ 'line1\\nline2\\n\\nline4' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent('>', blank=true) }}", {}),
    ("{{ items | selectattr('v') | map(attribute='k') | list }} {{ items | rejectattr('v') | map(attribute='k') | list }} {{ items | selectattr('k', 'equalto', 'y') | list }}", M),
    ("{{ l | select('odd') | list }} {{ l | reject('odd') | list }} {{ [0, 1, '', 'a', none] | select | list }} {{ words | map('upper') | join }}", M),
    ("{{ l | map('string') | join('+') }} {{ items | map(attribute='v', default=0) | list }}", M),
    # tests
    ("{{ n is defined }} {{ zz is defined }} {{ zz is undefined }} {{ none is none }} {{ s is string }} {{ d is mapping }} {{ l is mapping }} {{ l is iterable }} {{ n is iterable }} {{ zz is iterable }}", M),
    ("{{ s is sequence }} {{ l is sequence }} {{ d is sequence }} {{ n is sequence }} {{ n is number }} {{ f is number }} {{ t is number }} {{ n is integer }} {{ f is float }} {{ t is boolean }}", M),
    ("{{ t is true }} {{ 1 is true }} {{ fl is false }} {{ 0 is false }} {{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(2) }} {{ n is not none }} {{ 'abc' is lower }} {{ 'ABC' is upper }}", M),
    ("{{ n is eq 7 }} {{ n is ne 7 }} {{ n is lt 8 }} {{ n is gt 8 }} {{ n is in l }} {{ 1 is in l }} {{ n is sameas 7 }} {{ none is sameas none }} {{ range is callable }} {{ n is callable }}", M),
    ("{{ not n is defined }} {{ n + 1 is number }} {{ 'a' if n is defined else 'b' }}", M),
    # string methods
    ("{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nhi\\n'.lstrip('\\n') }}|{{ 'abcba'.rstrip('ab') }}", M),
    ("{{ 'a,b,,c'.split(',') }} {{ '  a  b c '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ ' x  y '.rsplit() }} {{ 'a<think>b</think>c'.split('</think>')[-1] }}", {}),
    ("{{ s.startswith('  He') }} {{ s.endswith('d  ') }} {{ s.startswith(('x', '  ')) }} {{ 'abc'.replace('b', 'BB') }} {{ 'ab'.replace('', '-') }} {{ s.upper() }} {{ s.lower() }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }}", M),
    ("{{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'héllo'.find('l') }} {{ 'banana'.count('an') }} {{ '-'.join(words) }} {{ 'a\\nb\\r\\nc'.splitlines() }} {{ '123'.isdigit() }} {{ 'ab1'.isalpha() }} {{ '  '.isspace() }}", M),
    ("{{ '{} and {}'.format('a', 1) }} {{ '{0}{1}{0}'.format('x', 'y') }} {{ '{name}!'.format(name='N') }} {{ '{{lit}}'.format() }}", {}),
    # statements
    ("{% if n > 5 %}big{% elif n > 2 %}mid{% else %}small{% endif %}|{% if e %}x{% elif none %}y{% else %}z{% endif %}|{% if zz %}never{% endif %}", M),
    ("{% for x in l %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}:{{ x }} {% endfor %}", M),
    ("{% for x in l %}[{{ loop.previtem }}|{{ x }}|{{ loop.nextitem }}]{{ loop.cycle('a', 'b') }}{% endfor %}", M),
    ("{% for x in l if x > 1 %}{{ x }}{{ loop.length }}{% if loop.last %}!{% endif %}{% endfor %}|{% for x in [] %}a{% else %}empty{% endfor %}|{% for x in l if x > 10 %}{% else %}none{% endfor %}", M),
    ("{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for c in 'héy' %}[{{ c }}]{% endfor %}|{% for a, b in [(1, 2), [3, 4]] %}{{ a + b }}{% endfor %}", M),
    ("{% for x in l %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}|{% for x in zz %}no{% endfor %}", M),
    ("{% for i in range(3) %}{% for j in range(i) %}{{ i }}{{ j }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %}{{ range(2, 10, 3) | list }}{{ range(5, 0, -2) | list }}", {}),
    ("{% set x = 1 %}{% for i in l %}{% set x = i %}{{ x }}{% endfor %}{{ x }}|{% if true %}{% set y = 5 %}{% endif %}{{ y }}", M),
    ("{% set ns = namespace(total=0, names=[]) %}{% for i in l %}{% set ns.total = ns.total + i %}{% endfor %}{{ ns.total }}{% set ns.names = ns.names + ['z'] %}{{ ns.names }}", M),
    ("{% set a, = [1] if false else [2] %}", {}),
    ("{% set t = 1, 2 %}{{ t }}{% set blk %}inner {{ n }}{% endset %}[{{ blk }}]", M),
    ("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }} {{ greet() }}", {}),
    ("{% macro outer(x) %}<{{ inner(x) }}>{% endmacro %}{% macro inner(y) %}{{ y * 2 }}{% endmacro %}{{ outer(4) }}{% set g = 'G' %}{% macro useg() %}{{ g }}{{ n }}{% endmacro %}{{ useg() }}", M),
    ("{{ '%s-%d|%5.2f|%x|%r|%%|%05d|%-4s|' % ('a', 3, 3.14159, 255, 'q', 42, 'ab') }}{{ '%s' % 5 }}{{ '%(k)s=%(v)d' % {'k': 'x', 'v': 1} }}{{ '%s' % [1] }}{{ '%e %g' % (12345.678, 0.0001) }}", {}),
    ("{{ '%s %s' % ('only one',) }}", {}),
    ("{{ 'abc' % [1] }}{{ 'abc' % {'a': 1} }}{{ '' is lower }}{{ 'a1' is lower }}{{ 2.5 is upper }}{{ 'A' is upper }}{{ zz is sequence }}", {}),
    ("{{ 'abc' % 5 }}", {}),
    ("{{ f is odd }}{{ f is even }}{{ 3.0 is odd }}{{ -1.0 is odd }}{{ 4.0 is even }}", {"f": 2.5}),
    ("{{ t[:2] }}", {"t": True}),
    ("{{ n[::-1] }}", {"n": 5}),
    ("{{ d[::-1] }}", {"d": {"a": 1}}),
    ("{% for i in [1,2] %}{% if i == 2 %}[{{ x }}]{% endif %}{% set x = i %}{% endfor %}{{ x }}", {}),
    ("{% set x = 0 %}{% for i in [1,2] %}[{{ x }}]{% set x = i %}{% endfor %}{{ x }}|{{ i }}", {}),
    ("{% macro m() %}{{ late }}{% endmacro %}{% set late = 5 %}{{ m() }}", {}),
    ("{% macro m() %}[{{ loopv }}]{% endmacro %}{% for loopv in [1] %}{{ m() }}{% endfor %}", {}),
    ("{% for x in [1,2] %}{{ loop.index }}{% for y in [3] %}{{ loop.index }}{{ loop.depth }}{% endfor %}{% endfor %}", {}),
    ("{% filter upper %}shout {{ n }}{% endfilter %}", M),
    ("{{ raise_exception('custom failure ü') }}", {}),
    ("{% if n %}{{ raise_exception('n is ' ~ n) }}{% endif %}", M),
    # whitespace control, trim_blocks, lstrip_blocks, comments, raw
    ("a\n  {% if true %}\n    b\n  {% endif %}\nc\n", {}),
    ("a  {%- if true -%}  b  {%- endif -%}  c\n", {}),
    ("x\n{{- ' y ' -}}\nz {{ 'w' }}\n  {{ 'v' }}  \n", {}),
    ("{# comment #}\nA\n  {# indented comment #}\nB {#- tight -#} C\n{#\nmulti\nline\n#}D", {}),
    ("{% raw %}{{ not rendered }}{% endraw %}|  {%+ if true %}keep{% endif %}|\n    {% if true +%}\nno-trim{% endif %}", {}),
    ("line1\r\nline2\r\n{% if true %}\r\nx\r\n{% endif %}\r\n", {}),
    ("\t{% for x in l %}\n\t\t{{ x }}\n\t{% endfor %}\n", M),
    ("{%- for m in messages -%}\n    {{- m.role }}: {{ m.content }}\n{% endfor -%}\nEND", M),
    ("trailing newline kept?\n\n", {}),
    ("{{ '{{' }} {{ '}}' }} {{ {'a': {'b': 1}} }}", {}),
    # errors Jinja raises at render time
    ("{{ 'a' + 1 }}", {}),
    ("{{ zz.attr }}", {}),
    ("{{ zz + 1 }}", {}),
    ("{{ n < 'a' }}", M),
    ("{{ 1 in 5 }}", {}),
    ("{{ l | tojson }}{{ zz | tojson }}", M),
    ("{{ d | items | first }}", M),
    ("{{ n() }}", M),
    ("{% set n.attr = 1 %}", M),
    ("{{ 5 | length }}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{% for a, b in l %}{% endfor %}", M),
    ("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", {}),
    ("{{ messages[0].content.startswith(1) }}", M),
]


def construct_cases(env):
    cases = []
    for i, (src, v) in enumerate(SNIPPETS):
        case = {"name": "construct_%03d" % i, "template": src, "vars": v}
        try:
            env.from_string(src)
        except TemplateError as e:
            case["compile_error"] = str(e)
            cases.append(case)
            continue
        case.update(render_case(env, src, v))
        cases.append(case)
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=64, help="random conversations per template")
    ap.add_argument("--seed", type=int, default=20261129)
    a = ap.parse_args()
    env = make_env()
    cases = construct_cases(env)
    out = os.path.join(DATA, "constructs.cases.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"generator": "tools/gen_chat_cases.py", "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("%s: %d cases" % (out, len(cases)), file=sys.stderr)
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
