#!/usr/bin/env python3
"""OpenAI request fields through the official `openai` client on the default model
(greedy, so every expectation is derived from a reference reply of the same server):
logit_bias, min_tokens, stop_token_ids; text content parts; developer messages; image /
audio / file content parts refused with a 400 naming the part type; malformed values, and
known fields whose meaning the server does not carry out (suffix, best_of, functions, audio
output), refused naming the field (raw HTTP).

Run by tests/cli_openai_fields.sh (--url of a server without an API key)."""
import argparse
import http.client
import json
import sys
import urllib.parse

try:
    import openai
except ImportError:
    print("FAIL: the python `openai` module is missing (python3 -m pip install openai)", file=sys.stderr)
    sys.exit(1)

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--url35", help="the same model served with Qwen3.5's chat template")
args = ap.parse_args()
U = urllib.parse.urlparse(args.url)
client = openai.OpenAI(base_url=args.url + "/v1", api_key="unused", max_retries=0, timeout=120)
MODEL = client.models.list().data[0].id
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr, flush=True)
    return cond


def raw(path, body):
    c = http.client.HTTPConnection(U.hostname, U.port, timeout=60)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    return r.status, r.read().decode()


def ids_of(choice):
    """Token ids of a completion's logprobs (return_tokens_as_token_ids)."""
    return [int(t.split(":")[1]) for t in choice.logprobs.tokens]


def complete(**kw):
    extra = {"return_tokens_as_token_ids": True}
    extra.update(kw.pop("extra_body", {}))
    return client.completions.create(model=MODEL, temperature=0, logprobs=0, extra_body=extra, **kw)


PROMPT = "The history of the city begins"
ref = complete(prompt=PROMPT, max_tokens=12)
ref_ids = ids_of(ref.choices[0])
check(len(ref_ids) == 12, f"reference: 12 tokens {ref_ids}")

# ------------------------------------------------------------------ logit_bias
# +100 on a token the greedy reply does not start with makes it the first token
target = next(t for t in range(1000, 2000) if t not in ref_ids[:1])
b = complete(prompt=PROMPT, max_tokens=3, logit_bias={str(target): 100})
check(ids_of(b.choices[0])[0] == target, f"logit_bias +100: first token {ids_of(b.choices[0])[:1]} = {target}")
# -100 on the greedy first token: another first token
b2 = complete(prompt=PROMPT, max_tokens=3, logit_bias={str(ref_ids[0]): -100})
check(ids_of(b2.choices[0])[0] != ref_ids[0], "logit_bias -100 bans the greedy token")
# a bias of 0 changes nothing (and goes through the sampler's path, not the argmax one)
b3 = complete(prompt=PROMPT, max_tokens=12, logit_bias={str(target): 0})
check(ids_of(b3.choices[0]) == ref_ids, "logit_bias 0: same tokens as without")
# chat too
cb = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=2, logprobs=True,
                                    messages=[{"role": "user", "content": "Hello"}], logit_bias={str(target): 100},
                                    extra_body={"return_tokens_as_token_ids": True})
check(cb.choices[0].logprobs.content[0].token == f"token_id:{target}", "logit_bias on chat")

# ------------------------------------------------------------------ min_tokens
HELLO = [{"role": "user", "content": "Hello"}]
short = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=60, messages=HELLO)
n_short = short.usage.completion_tokens
check(short.choices[0].finish_reason == "stop" and n_short < 40, f"min_tokens: reference ends at EOS ({n_short} tokens)")
m = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=60, messages=HELLO, extra_body={"min_tokens": n_short + 8})
check(m.usage.completion_tokens >= n_short + 8, f"min_tokens: {m.usage.completion_tokens} >= {n_short + 8} (EOS suppressed)")
check(m.choices[0].message.content.startswith(short.choices[0].message.content), "min_tokens: the same text up to the old EOS")
m0 = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=60, messages=HELLO, extra_body={"min_tokens": 0})
check(m0.choices[0].message.content == short.choices[0].message.content, "min_tokens 0: no change")
# stop strings do not apply before min_tokens: a stop at the reply's second word is skipped
word = short.choices[0].message.content.split()[1]
s1 = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=60, messages=HELLO, stop=[word])
check(s1.usage.completion_tokens < n_short and s1.choices[0].finish_reason == "stop", f"stop reference: cut at {word!r}")
s2 = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=60, messages=HELLO, stop=[word],
                                    extra_body={"min_tokens": n_short + 8})
check(word in s2.choices[0].message.content and s2.usage.completion_tokens >= n_short + 8,
      f"min_tokens: the stop string before min_tokens is ignored: {s2.choices[0].message.content!r}")

# ------------------------------------------------------------------ stop_token_ids
k = next(i for i in range(2, 12) if ref_ids[i] not in ref_ids[:i])
st = complete(prompt=PROMPT, max_tokens=12, extra_body={"stop_token_ids": [ref_ids[k]]})
check(ids_of(st.choices[0]) == ref_ids[:k + 1], f"stop_token_ids: ends on the stop token ({len(ids_of(st.choices[0]))} tokens, wanted {k + 1})")
check(st.choices[0].finish_reason == "stop", f"stop_token_ids: finish_reason {st.choices[0].finish_reason}")
pre = complete(prompt=PROMPT, max_tokens=k)
check(st.choices[0].text == pre.choices[0].text, f"stop_token_ids: the stop token's text is left out: {st.choices[0].text!r}")
# with min_tokens past it, the stop token is suppressed until then
st2 = complete(prompt=PROMPT, max_tokens=12, extra_body={"stop_token_ids": [ref_ids[k]], "min_tokens": 12})
check(len(ids_of(st2.choices[0])) == 12 and ref_ids[k] not in ids_of(st2.choices[0]), "stop_token_ids suppressed before min_tokens")

# ------------------------------------------------------------------ text content parts
# the default model's template takes string content only: the parts' text goes in joined with
# newlines (as vLLM joins it), so the reply is the one to that string; before, the template
# failed on the list (a 400 from every Qwen3 / Qwen3-Next template)
parts = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=12, messages=[
    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "who are you?"}]}])
sys_joined = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=12, messages=[
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello\nwho are you?"}])
check(parts.choices[0].message.content == sys_joined.choices[0].message.content and
      parts.usage.prompt_tokens == sys_joined.usage.prompt_tokens, "text parts: the reply to their joined text")
# an assistant message holding tool calls comes back from clients with "content": null; a template
# that takes strings gets "" (Qwen3's and the default model's failed on the null: a 400)
def with_content(content):
    return client.chat.completions.create(model=MODEL, temperature=0, max_tokens=1, messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": content, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]).usage.prompt_tokens


check(with_content(None) == with_content(""), "assistant content null: rendered as the empty string")
# a developer message (OpenAI's newer name for system instructions) is the system message: Qwen
# templates know no developer role (Qwen3's dropped the message without a word)
dev = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=12, messages=[
    {"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hello\nwho are you?"}])
check(dev.choices[0].message.content == sys_joined.choices[0].message.content and
      dev.usage.prompt_tokens == sys_joined.usage.prompt_tokens, "developer message: the system message")

# ------------------------------------------------------------------ Qwen3.5's template
if args.url35:
    c35 = openai.OpenAI(base_url=args.url35 + "/v1", api_key="unused", max_retries=0, timeout=120)

    def prompt_tokens(msgs):
        return c35.chat.completions.create(model=MODEL, max_tokens=1, temperature=0,
                                           messages=msgs).usage.prompt_tokens

    # it renders lists of parts itself (their texts one after another, as transformers would)
    check(prompt_tokens([{"role": "user", "content": [{"type": "text", "text": "Hello"},
                                                      {"type": "text", "text": " who are you?"}]}]) ==
          prompt_tokens([{"role": "user", "content": "Hello who are you?"}]), "Qwen3.5 template: parts passed as a list")

    # a history tool call's arguments as the JSON string clients send back count as the object
    # they hold: the template writes parameters only from an object (before: the call without them)
    def history(arguments):
        return [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]

    as_string = prompt_tokens(history('{"city": "Paris", "days": 3}'))
    as_object = prompt_tokens(history({"city": "Paris", "days": 3}))
    empty = prompt_tokens(history("{}"))
    check(as_string == as_object and as_string > empty + 8,
          f"Qwen3.5 template: string arguments rendered ({as_string} / {as_object} / {empty} tokens)")

# ------------------------------------------------------------------ refused content parts
for part, ty in [({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "image_url"),
                 ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "input_audio"),
                 ({"type": "file", "file": {"file_id": "f1"}}, "file"),
                 ({"type": "video_url", "video_url": {"url": "x"}}, "video_url")]:
    try:
        client.chat.completions.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, part]}])
        check(False, f"{ty} part: no error")
    except openai.BadRequestError as e:
        msg = e.body.get("message", "") if isinstance(e.body, dict) else str(e)
        check(f"'{ty}'" in msg and "content[1]" in msg and "text only" in msg, f"{ty} part: 400 naming it: {msg!r}")

# ------------------------------------------------------------------ malformed values (raw)
base = {"model": MODEL, "max_tokens": 4, "messages": HELLO}
for extra, param, words in [
    ({"logit_bias": {"abc": 1}}, "logit_bias", ["abc"]),
    ({"logit_bias": {"5": 101}}, "logit_bias", ["[-100, 100]"]),
    ({"logit_bias": {"99999999": 1}}, "logit_bias", ["99999999"]),
    ({"logit_bias": [1, 2]}, "logit_bias", ["object"]),
    ({"stop_token_ids": [-1]}, "stop_token_ids", ["stop_token_ids[0]"]),
    ({"stop_token_ids": "5"}, "stop_token_ids", ["array"]),
    ({"min_tokens": -2}, "min_tokens", ["min_tokens"]),
    ({"min_tokens": 5}, "min_tokens", ["max_tokens"]),
    ({"top_k": 4.4e25}, "top_k", ["integer"]),  # a float past long long's range (converting it was undefined)
    ({"messages": [{"role": "user", "content": [{"type": "banana"}]}]}, "messages", ["banana"]),
    # known fields whose meaning this server does not carry out: refused, not ignored
    ({"functions": [{"name": "f", "parameters": {}}]}, "functions", ["deprecated", "tools"]),
    ({"function_call": "auto"}, "function_call", ["deprecated"]),
    ({"modalities": ["text", "audio"]}, "modalities", ["text only"]),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", ["text only"]),
    ({"prompt": "Hi", "suffix": " world"}, "suffix", ["suffix"]),
    ({"prompt": "Hi", "best_of": 3}, "best_of", ["best_of"]),
    ({"prompt": ["Hi", 5]}, "prompt", ["prompt 1 of the batch"]),
    ({"prompt": [[1, 2], [3]] * 65}, "prompt", ["130 prompts", "at most 128"]),
    ({"prompt": [[1]] * 9, "n": 16}, "prompt", ["9 prompts", "at most 128 choices"]),
    ({"prompt": [[1], []]}, "prompt", ["empty", "prompt 1 of the batch"]),
]:
    completion = "prompt" in extra
    body = {"model": MODEL, "max_tokens": 4} if completion else dict(base)
    body.update(extra)
    code, text = raw("/v1/completions" if completion else "/v1/chat/completions", body)
    j = json.loads(text)
    err = j.get("error", {})
    check(code == 400 and err.get("param") == param and all(w in err.get("message", "") for w in words),
          f"{extra}: 400 naming {param}: {code} {text}")

if failures:
    print(f"{len(failures)} check(s) failed", file=sys.stderr)
    sys.exit(1)
print("test_openai_fields: all checks passed")
