"""A REAL local HTTP server speaking OpenAI chat-completions, for grader tests (127.0.0.1 only).

Run: ``python tests/helpers/fake_openai_server.py PORT LIFETIME_S``. It exits by itself after
LIFETIME_S seconds. Behaviour is switched at runtime: ``POST /control {"mode": M, "delay": s,
"score": "0.5", "ok_first": n}`` with M in ok | slow | error500 | error400 | malformed | unparsable (``ok_first``:
the first n chat requests answered as ``ok`` whatever the mode, e.g. a start-up probe before the garbage). ``GET /stats`` returns
the request count, ``GET /requests`` the bodies of the last 64 chat requests (:func:`requests_seen`). ``start_server(lifetime)`` starts it as a subprocess and returns (proc, base_url).
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request


def start_server(lifetime: float = 120.0):
    from tests.helpers.dist import (
        free_port,  # here: this file also runs as a script, without the repo on sys.path
    )

    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, str(port), str(lifetime)])
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/stats", timeout=0.5)
            return proc, url + "/v1"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("fake OpenAI server did not start")


def requests_seen(url: str) -> list[dict]:
    """JSON bodies of the last 64 chat-completion requests the server received."""
    base = url.rsplit("/v1", 1)[0]
    return json.loads(urllib.request.urlopen(base + "/requests", timeout=5).read())


def control(url: str, **kw) -> None:
    base = url.rsplit("/v1", 1)[0]
    req = urllib.request.Request(base + "/control", data=json.dumps(kw).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=5).read()


def _main(port: int, lifetime: float) -> None:
    from aiohttp import web

    state = {"mode": "ok", "delay": 0.0, "score": "1", "requests": 0, "ok_first": 0}
    bodies: list = []

    async def chat(req):
        state["requests"] += 1
        body = await req.json()
        bodies.append(body)
        del bodies[:-64]
        mode = "ok" if state["requests"] <= state["ok_first"] else state["mode"]
        if mode == "slow":
            await asyncio.sleep(state["delay"])
        if mode == "error500":
            return web.Response(status=500, text="internal error")
        if mode == "error400":     # vLLM's reply to a max_tokens beyond its context
            return web.json_response({"object": "error", "type": "BadRequestError", "code": 400, "error": {
                "message": "max_tokens=16384 cannot be greater than max_model_len=8192. Please request fewer output "
                           "tokens.", "type": "BadRequestError", "code": 400}}, status=400)
        if mode == "malformed":
            return web.Response(status=200, text="{not json", content_type="application/json")
        outcome = "Final Grade:" in json.dumps(body.get("messages"))   # the outcome verifier's prompt: its format
        ok_text = ("The answers match.\nFinal Grade: CORRECT" if outcome else
                   f"Step by step ... final \\boxed{{{state['score']}}}")
        text = "I cannot decide." if mode == "unparsable" else ok_text
        return web.json_response({"id": "x", "object": "chat.completion", "model": body.get("model"),
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": text}}]})

    async def ctl(req):
        state.update(await req.json())
        return web.json_response(state)

    async def stats(req):
        return web.json_response(state)

    async def seen(req):
        return web.json_response(bodies)

    app = web.Application()
    app.add_routes([web.post("/v1/chat/completions", chat), web.post("/control", ctl), web.get("/stats", stats),
                    web.get("/requests", seen)])

    async def run():
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.sleep(lifetime)
        await runner.cleanup()

    asyncio.run(run())


if __name__ == "__main__":
    _main(int(sys.argv[1]), float(sys.argv[2]))
