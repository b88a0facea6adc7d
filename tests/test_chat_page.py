#!/usr/bin/env python3
"""The chat page at / in headless Chromium, driven over the DevTools protocol
(websocket-client from PyPI): the page loads with nothing from the network, shows the
served model, renders Markdown, a typed message gets a streamed reply with its
tokens/s, the stop button ends a running reply; a screenshot is saved.

  test_chat_page.py --url http://127.0.0.1:PORT --chromium /usr/bin/chromium --model NAME --screenshot OUT.png
Exits nonzero on a failed check."""
import argparse
import base64
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

try:
    import websocket
except ImportError:
    print("FAIL: the python `websocket` module is missing (python3 -m pip install websocket-client)", file=sys.stderr)
    sys.exit(1)

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--chromium", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--screenshot", required=True)
args = ap.parse_args()
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr, flush=True)
    return cond


profile = tempfile.mkdtemp(prefix="qd-chromium-")
browser = subprocess.Popen(
    [args.chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
     "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1", f"--user-data-dir={profile}",
     "--window-size=1000,760", "about:blank"],
    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


class CDP:
    """A minimal DevTools client: one page target, calls answered by id, events kept."""

    def __init__(self, ws_url):
        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events = []

    def call(self, method, **params):
        self.next_id += 1
        my = self.next_id
        self.ws.send(json.dumps({"id": my, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def js(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expr, seconds, what):
        end = time.time() + seconds
        while time.time() < end:
            if self.js(expr):
                return True
            time.sleep(0.1)
        return check(False, f"timed out waiting for {what}")


try:
    port = None
    end = time.time() + 60
    while time.time() < end and port is None:
        line = browser.stderr.readline()
        if not line and browser.poll() is not None:
            break
        m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
        if m:
            port = int(m.group(1))
    if not check(port is not None, "chromium started with a DevTools port"):
        sys.exit(1)
    targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
    page = next(t for t in targets if t["type"] == "page")
    cdp = CDP(page["webSocketDebuggerUrl"])
    cdp.call("Network.enable")
    cdp.call("Page.enable")
    cdp.call("Page.navigate", url=args.url + "/")
    cdp.wait("document.readyState === 'complete' && !!document.getElementById('model')", 30, "the page to load")
    cdp.wait("document.getElementById('model').textContent !== '…'", 30, "the model name")
    check(cdp.js("document.getElementById('model').textContent").startswith(args.model), "the served model is shown")
    # every request the page made went to this server
    urls = [e["params"]["request"]["url"] for e in cdp.events if e.get("method") == "Network.requestWillBeSent"]
    check(urls and all(u.startswith(args.url) for u in urls), f"no network resources besides the server: {urls}")

    # the Markdown renderer
    md = cdp.js(r"""mdRender("# Title\nSome **bold**, *it* and `x<y`.\n\n- one\n- two\n\n```python\nprint('<b>')\n```\n<script>alert(1)</script>")""")
    check("<h3>Title</h3>" in md, f"markdown: heading {md}")
    check("<strong>bold</strong>" in md and "<em>it</em>" in md, "markdown: bold and italics")
    check("<code>x&lt;y</code>" in md, "markdown: inline code, escaped")
    check("<ul><li>one</li><li>two</li></ul>" in md, "markdown: list")
    check('<pre><span class="lang">python</span><code>print(\'&lt;b&gt;\')</code></pre>' in md, "markdown: fenced code block")
    check("<script>" not in md and "&lt;script&gt;" in md, "markdown: HTML is escaped")
    unclosed = cdp.js(r"""mdRender("text\n```c\nint x;")""")
    check("<pre>" in unclosed and "int x;" in unclosed, "markdown: an unclosed fence while streaming is code so far")

    # type a message and press Enter: a streamed reply
    cdp.js("document.getElementById('input').focus()")
    cdp.call("Input.insertText", text="Hello! Who are you?")
    for kind in ("keyDown", "keyUp"):
        cdp.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter", windowsVirtualKeyCode=13)
    cdp.wait("document.querySelectorAll('.msg.assistant .stats').length === 1", 120, "the first reply")
    reply = cdp.js("document.querySelector('.msg.assistant .body').textContent")
    stats = cdp.js("document.querySelector('.msg.assistant .stats').textContent")
    check(len(reply.strip()) > 0, f"a reply arrived: {reply!r}")
    check(cdp.js("document.querySelector('.msg.user .body').textContent") == "Hello! Who are you?", "the user message is shown")
    check(re.search(r"\d+ tokens · [\d.]+ tokens/s", stats) is not None, f"tokens/s shown: {stats!r}")
    check(cdp.js("document.body.dataset.state") == "idle" and not cdp.js("document.getElementById('send').disabled"),
          "idle again after the reply")

    # a second, long reply stopped by the button
    # options merged into the request: no EOS, so the reply runs until stopped
    cdp.js("document.getElementById('opts').value = '{\"ignore_eos\": true, \"temperature\": 0}'")
    cdp.js("document.getElementById('input').value = 'Tell me a very long story about the sea.';"
           "document.getElementById('form').requestSubmit()")
    cdp.wait("document.querySelectorAll('.msg.assistant .body')[1] && "
             "document.querySelectorAll('.msg.assistant .body')[1].textContent.length > 0", 60, "the second reply to start")
    check(not cdp.js("document.getElementById('stop').disabled"), "stop button enabled while streaming")
    cdp.js("document.getElementById('stop').click()")
    cdp.wait("document.querySelectorAll('.msg.assistant .stats').length === 2", 30, "the stopped reply")
    stats2 = cdp.js("document.querySelectorAll('.msg.assistant .stats')[1].textContent")
    check("stopped" in stats2, f"the stop button ended the reply: {stats2!r} "
          f"({cdp.js('document.querySelectorAll(`.msg.assistant .body`)[1].textContent')!r})")

    # thinking on (the Qwen3.5 template opens <think>): the reasoning arrives folded
    cdp.js("document.getElementById('opts').value = '{\"max_tokens\": 24, \"temperature\": 0}';"
           "document.getElementById('think').checked = true;"
           "document.getElementById('input').value = 'What is two plus two?';"
           "document.getElementById('form').requestSubmit()")
    cdp.wait("document.querySelectorAll('.msg.assistant .stats').length === 3", 60, "the thinking reply")
    third = "document.querySelectorAll('.msg.assistant')[2]"
    if check(cdp.js(third + ".querySelectorAll('details').length") == 1,
             f"thinking: the reasoning is in a <details> fold ({cdp.js(third + '.textContent')!r})"):
        check(cdp.js("!" + third + ".querySelector('details').open"), "thinking: folded")
        check(len(cdp.js(third + ".querySelector('.reasoning').textContent")) > 0, "thinking: the reasoning text is there")

    shot = cdp.call("Page.captureScreenshot", format="png")
    os.makedirs(os.path.dirname(os.path.abspath(args.screenshot)), exist_ok=True)
    with open(args.screenshot, "wb") as f:
        f.write(base64.b64decode(shot["data"]))
    print("screenshot:", os.path.abspath(args.screenshot))
finally:
    browser.terminate()
    try:
        browser.wait(10)
    except subprocess.TimeoutExpired:
        browser.kill()

if failures:
    print(f"{len(failures)} check(s) failed", file=sys.stderr)
    sys.exit(1)
print("test_chat_page: all checks passed")
