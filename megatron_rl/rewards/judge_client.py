"""OpenAI-compatible chat client shared by the LLM judges (PAPO's rubric grader, ``grader.py``, and its
LLM outcome verifier, ``outcome_judge.py``).

One request is one user message; the judge's text is the reply's ``choices[0].message.content``.
Bounded concurrency (an asyncio semaphore), a per-request timeout, retries with exponential backoff
(``backoff · 2^k`` seconds), a circuit breaker (``breaker.py``) and counters (:meth:`JudgeClient.stats`).
``max_tokens`` None or 0 leaves the field out, so the server decides (vLLM: the rest of its context).

Failure classes, each counted:

* refused / reset connections, timeouts, HTTP 5xx, 408 and 429 (``http_errors`` / ``timeouts``):
  transient; retried, each attempt a breaker failure.
* HTTP 200 whose body is not a chat completion (not JSON, no ``choices[0].message``; ``malformed``):
  a breaker failure exactly like a refused connection. A server that answers garbage is as unusable
  as one that is down; counting it only as "malformed" (as before) let every request pay its full
  retry budget while the breaker never opened (PAPO steps of 57-92 s instead of ~4 s).
* any other HTTP 4xx (``client_errors``: 400 for a request that does not fit the served context, 404
  for an unknown model, 401/403 for a key, 422): the server refuses this request and would refuse it
  again, so it is not retried; the server's own message is logged (once per distinct text) and it is
  a breaker failure. When the breaker opens on consecutive 4xx replies the judge is misconfigured,
  not down: the batch ends with :class:`JudgeRejected` carrying the server's text, and the training
  loop stops at that step boundary with one line (``trainer/loop/rl_loop.py``) rather than train the rest of
  the run on fallback scores. Why not stop at the first 4xx: one over-long student solution can
  overflow the judge's context for that request alone; that one grade is a counted fallback, not a
  reason to end the run. The start-up probe (:func:`probe`, ``preflight_judge.check_grader``) refuses a
  misconfiguration before training starts.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import urllib.request

from megatron_rl.rewards.breaker import CircuitBreaker, log

#: 4xx statuses that are transient (request timeout, rate limit): retried like a 5xx
TRANSIENT_4XX = (408, 429)


class JudgeRejected(RuntimeError):
    """The judge refused ``breaker.failures`` consecutive requests with an HTTP 4xx: a misconfiguration
    (context, model name, key), not an outage. The message carries the server's own text, one line."""


class JudgeUnreadable(JudgeRejected):
    """Most replies of one batch carried no verdict the judge's parser reads, under
    ``reward.grader_unparsable_policy=stop``: the run stops at that step as for a refusing judge (a judge
    that cannot be read is no judge: its every score would be the 0 of an unparsable reply)."""


@dataclasses.dataclass
class JudgeStats:
    calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    timeouts: int = 0
    http_errors: int = 0
    client_errors: int = 0     # HTTP 4xx other than 408 / 429: the request refused, not retried
    malformed: int = 0         # HTTP 200 whose body is not a chat completion (a breaker failure)
    unparsable: int = 0        # a well-formed reply whose text has no verdict the judge's parser accepts
    replies: int = 0           # well-formed replies parsed (the denominator of the unreadable-batch rule)
    unreadable_batches: int = 0   # batches where most replies were unparsable (each a breaker failure)
    fallbacks: int = 0
    breaker_skips: int = 0     # requests not sent because the circuit breaker was open (breaker.py)
    breaker_opens: int = 0


def one_line(text: str, limit: int = 400) -> str:
    text = re.sub(r"\s+", " ", str(text)).strip()
    return text if len(text) <= limit else text[:limit] + " ..."


def server_message(status: int, raw: str) -> str:
    """``HTTP <status>: <the server's message>`` from an error body (OpenAI / vLLM ``{"error": {"message"}}``,
    older vLLM ``{"message"}``, FastAPI ``{"detail"}``), else the raw body; one line."""
    msg = raw
    try:
        obj = json.loads(raw)
        if isinstance(obj, dict):
            err = obj.get("error")
            msg = (err.get("message") if isinstance(err, dict) else err) or obj.get("message") or obj.get("detail") or raw
    except ValueError:
        pass
    return f"HTTP {status}: {one_line(msg if isinstance(msg, str) else json.dumps(msg)) or '(empty body)'}"


def chat_content(raw: str) -> str | None:
    """The judge's text of a chat-completion body; None when the body is not one (malformed).
    A null ``content`` (e.g. a reasoning model cut by ``max_tokens``) is an empty text, not malformed."""
    try:
        msg = json.loads(raw)["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    if not isinstance(msg, dict):
        return None
    content = msg.get("content")
    if content is None:
        return ""
    return content if isinstance(content, str) else None


class JudgeClient:
    """Send prompts to an OpenAI-compatible chat endpoint; see the module docstring. ``name`` prefixes
    the metrics (``grader/calls`` ...) and the console lines."""

    def __init__(self, base_url: str, model: str, *, name: str = "grader", concurrency: int = 8,
                 timeout: float = 120.0, retries: int = 3, backoff: float = 1.0, temperature: float = 0.1,
                 max_tokens: int | None = None, api_key: str = "EMPTY"):
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.name, self.model, self.concurrency, self.timeout = name, model, concurrency, timeout
        self.retries, self.backoff, self.temperature = retries, backoff, temperature
        self.max_tokens, self.api_key = (max_tokens or None), api_key
        self._stats = JudgeStats()
        self.breaker = CircuitBreaker(name=name)   # replaced by setup with the configured thresholds
        self.rejected: str | None = None           # the server's text once the breaker opened on 4xx replies
        self.unparsable_policy = "stop"            # a batch of mostly unparsable replies: warn | stop (setup sets it)
        self.last_unparsable = ""                  # the start of the last reply the parser could not read
        self._consecutive_4xx = 0
        self._logged: set[str] = set()

    def body(self, prompt: str) -> dict:
        b = {"model": self.model, "temperature": self.temperature, "messages": [{"role": "user", "content": prompt}]}
        if self.max_tokens:
            b["max_tokens"] = int(self.max_tokens)
        return b

    def stats(self) -> dict[str, float]:
        self._stats.breaker_skips, self._stats.breaker_opens = self.breaker.skips, self.breaker.opens
        return {f"{self.name}/{k}": float(v) for k, v in dataclasses.asdict(self._stats).items()}

    def _client_error(self, msg: str) -> None:
        self._stats.client_errors += 1
        self._consecutive_4xx += 1
        if msg not in self._logged and len(self._logged) < 16:
            self._logged.add(msg)
            log.warning("%s at %s refused a request (not retried): %s", self.name, self.url, msg)
        self.breaker.failure(msg)
        if self.breaker.state != "closed" and self._consecutive_4xx >= self.breaker.failures:
            self.rejected = msg

    async def ask(self, session, sem, prompt: str) -> str | None:
        """The judge's text, or None after the retries / an open breaker / a refused request (counted)."""
        import aiohttp  # lazy: defers aiohttp to the call

        body = self.body(prompt)
        async with sem:
            for attempt in range(self.retries + 1):
                if attempt:
                    self._stats.retries += 1
                    await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
                if self.rejected is not None or not self.breaker.allow():
                    break
                self._stats.calls += 1
                try:
                    async with session.post(self.url, json=body, timeout=aiohttp.ClientTimeout(total=self.timeout),
                                            headers={"Authorization": f"Bearer {self.api_key}"}) as r:
                        status, raw = r.status, await r.text()
                except asyncio.TimeoutError:
                    self._stats.timeouts += 1
                    self.breaker.failure("timeout")
                    continue
                except (aiohttp.ClientError, OSError) as e:
                    self._stats.http_errors += 1
                    self.breaker.failure(type(e).__name__)
                    continue
                if status != 200:
                    msg = server_message(status, raw)
                    if 400 <= status < 500 and status not in TRANSIENT_4XX:
                        self._client_error(msg)
                        break
                    self._stats.http_errors += 1
                    self.breaker.failure(msg)
                    continue
                content = chat_content(raw)
                if content is None:
                    self._stats.malformed += 1
                    self.breaker.failure(f"HTTP 200 but not a chat completion: {one_line(raw, 80)!r}")
                    continue
                self.breaker.success()
                self._consecutive_4xx = 0
                return content
        return None

    async def ask_all(self, run_one, items: list) -> list:
        """``[await run_one(session, sem, item) for item]`` concurrently, one HTTP session."""
        import aiohttp  # lazy: defers aiohttp to the call

        sem = asyncio.Semaphore(self.concurrency)
        async with aiohttp.ClientSession() as s:
            return list(await asyncio.gather(*(run_one(s, sem, it) for it in items)))

    def parsed(self, content: str, ok: bool) -> None:
        """Count one reply the parser read (``ok``) or could not (remembering its start for the warning)."""
        self._stats.replies += 1
        if not ok:
            self._stats.unparsable += 1
            self.last_unparsable = one_line(content, 80)

    def check_readable(self, replies_before: int, unparsable_before: int) -> None:
        """After a batch: when most of its replies were unparsable, a breaker failure and a counted
        ``unreadable_batches``, then ``unparsable_policy``: ``warn`` logs one line, ``stop`` raises
        :class:`JudgeUnreadable` (the loop stops at this step)."""
        replied = self._stats.replies - replies_before
        bad = self._stats.unparsable - unparsable_before
        if replied == 0 or 2 * bad <= replied:
            return
        self._stats.unreadable_batches += 1
        msg = (f"{self.name} at {self.url} (model {self.model!r}): {bad} of {replied} replies of this step had no "
               f"verdict its parser reads (scored as wrong), e.g. {self.last_unparsable!r}")
        self.breaker.failure("most replies unparsable")
        if self.unparsable_policy == "stop":
            raise JudgeUnreadable(msg + "; use a judge that follows the prompt's format, or "
                                        "reward.grader_unparsable_policy=warn to train on")
        log.warning("%s (reward.grader_unparsable_policy=warn: training on)", msg)

    def raise_if_rejected(self) -> None:
        if self.rejected is not None:
            raise JudgeRejected(f"{self.name} at {self.url} (model {self.model!r}) refused {self._consecutive_4xx} "
                                f"consecutive requests: {self.rejected}; fix the reward.grader_* settings or the "
                                "server (stopping rather than training on fallback scores)")


def served_max_model_len(base_url: str, model: str, timeout: float = 10.0) -> int | None:
    """``max_model_len`` of ``model`` from the server's ``GET /models`` (vLLM lists it); None when the
    server does not say (another OpenAI-compatible server, or the model is not listed)."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=timeout) as r:
            data = json.loads(r.read())
        for m in data.get("data", []):
            if isinstance(m, dict) and m.get("id") == model and isinstance(m.get("max_model_len"), int):
                return m["max_model_len"]
    except (OSError, ValueError, AttributeError):
        return None
    return None


def first_reply(client: JudgeClient, prompt: str) -> str | None:
    """The judge's whole text for ``prompt`` (one request with the run's body, retries and breaker), or None."""
    return asyncio.run(client.ask_all(lambda s, sem, p: client.ask(s, sem, p), [prompt]))[0]


def probe(client: JudgeClient, prompt: str, timeout: float) -> None:
    """One real request with ``client``'s body for ``prompt`` (model, temperature, ``max_tokens``), streamed
    and closed after the first chunk, so a judge that would write thousands of tokens costs one token.
    Raises ``ValueError`` (one line, the server's own text) when the server refuses it or answers
    something that is not a chat completion."""
    import aiohttp  # lazy: defers aiohttp to the call

    async def go():
        body = {**client.body(prompt), "stream": True}
        async with aiohttp.ClientSession() as s:
            async with s.post(client.url, json=body, timeout=aiohttp.ClientTimeout(total=timeout),
                              headers={"Authorization": f"Bearer {client.api_key}"}) as r:
                if r.status != 200:
                    return server_message(r.status, await r.text())
                if "text/event-stream" not in r.headers.get("Content-Type", ""):
                    raw = await r.text()        # a server that ignores "stream": the whole reply
                    return None if chat_content(raw) is not None else f"HTTP 200 but not a chat completion: {one_line(raw, 120)!r}"
                async for line in r.content:
                    text = line.decode("utf-8", "replace").strip()
                    if not text.startswith("data:"):
                        continue
                    payload = text[5:].strip()
                    try:
                        obj = json.loads(payload)
                    except ValueError:
                        return f"HTTP 200 but the stream is not chat-completion chunks: {one_line(payload, 120)!r}"
                    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
                        return server_message(obj["error"].get("code") or 200, payload)
                    if isinstance(obj, dict) and isinstance(obj.get("choices"), list):
                        return None
                    return f"HTTP 200 but the stream is not chat-completion chunks: {one_line(payload, 120)!r}"
                return "HTTP 200 but the stream ended without a chunk"

    try:
        err = asyncio.run(go())
    except asyncio.TimeoutError:
        err = f"no reply within {timeout:g} s"
    except (aiohttp.ClientError, OSError) as e:
        err = f"{type(e).__name__}: {one_line(e)}"
    if err is not None:
        raise ValueError(err)
