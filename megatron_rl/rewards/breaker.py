"""Circuit breaker for the rubric grader: stop paying retries to a grader that is down.

Without it, a grader that refuses connections costs every request its full retry budget
(``retries`` attempts with exponential backoff) and a PAPO step took ~90 s longer, visible only in
the metrics. States (the classic breaker, e.g. Nygard, "Release It!"):

* closed: requests go through; ``failures`` consecutive failed attempts open it;
* open: no request is sent for ``cooldown`` seconds, the caller uses its fallback at once
  (counted as ``grader/breaker_skips``); opening logs one console warning with the count;
* half-open (after the cooldown): requests go through again; the first success closes it, the
  first failure opens it again for another cooldown.

A success resets the consecutive-failure count. Single-threaded use (one asyncio loop), no lock.
"""
from __future__ import annotations

import logging
import time

log = logging.getLogger("megatron_rl.grader")


class CircuitBreaker:
    """See module docstring. ``clock`` is injectable for tests of the timing (defaults to monotonic)."""

    def __init__(self, failures: int = 5, cooldown: float = 60.0, name: str = "grader", clock=time.monotonic):
        if failures < 1 or not cooldown > 0:
            raise ValueError(f"circuit breaker needs failures >= 1 and cooldown > 0, got {failures}, {cooldown}")
        self.failures, self.cooldown, self.name, self.clock = failures, float(cooldown), name, clock
        self.consecutive = 0
        self.opened_at: float | None = None
        self.opens = 0
        self.skips = 0

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return "closed"
        return "open" if self.clock() - self.opened_at < self.cooldown else "half-open"

    def allow(self) -> bool:
        """Whether a request may be sent now (False: use the fallback; counted in ``skips``)."""
        if self.state == "open":
            self.skips += 1
            return False
        return True

    def success(self) -> None:
        if self.opened_at is not None:
            log.warning("%s is answering again: circuit breaker closed", self.name)
        self.consecutive, self.opened_at = 0, None

    def failure(self, why: str = "") -> None:
        self.consecutive += 1
        half_open = self.state == "half-open"
        if self.state == "closed" and self.consecutive < self.failures:
            return
        if self.state == "open":
            return
        self.opened_at = self.clock()
        self.opens += 1
        log.warning("%s: %d consecutive failed requests%s%s; skipping it for %.0f s (fallback score used at once)",
                    self.name, self.consecutive, f" (last: {why})" if why else "",
                    " after the half-open probe" if half_open else "", self.cooldown)
