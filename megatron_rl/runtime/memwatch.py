"""Peak memory of this process while a block runs, for the weight-transport bound (sender extra
memory ≤ 2 buckets): private resident memory (RSS − shared) sampled every 2 ms on a thread, and the
shared pages (Ray's object store mapped in by ``ray.put``) tracked separately, so a backend that
stages through the object store is not charged for, nor hidden behind, those pages."""
from __future__ import annotations

import threading
import time


class PeakRSS:
    """``with PeakRSS() as m: ...`` then ``m.extra`` (peak private bytes above the start) and
    ``m.shared_peak - m.shared_base`` (peak shared bytes above the start)."""

    def __enter__(self) -> "PeakRSS":
        import psutil

        self._p, self._stop = psutil.Process(), False
        m = self._p.memory_info()
        self.base = self.peak = m.rss - m.shared
        self.shared_base = self.shared_peak = m.shared
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop:
            m = self._p.memory_info()
            self.peak = max(self.peak, m.rss - m.shared)
            self.shared_peak = max(self.shared_peak, m.shared)
            time.sleep(0.002)

    def __exit__(self, *exc) -> None:
        self._stop = True
        self._t.join()

    @property
    def extra(self) -> int:
        return self.peak - self.base
