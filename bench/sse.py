"""Server-sent events of an OpenAI-style streaming response, shared by the bench clients."""
import json


def sse_events(resp):
    """Yields the JSON object of each `data:` event of resp (an http.client response) as it
    arrives, skipping `[DONE]`, until the server closes the stream."""
    buf = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            return
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if ev.startswith(b"data: ") and ev[6:] != b"[DONE]":
                yield json.loads(ev[6:])
