"""Imported FIRST by the reward pool's forkserver (``rewards/pool.py``, its preload list): the forkserver
ignores SIGINT from here on.

Why: a terminal's Ctrl-C reaches every process of its foreground group, the driver's children included.
multiprocessing's forkserver ignores SIGINT only after it has imported its preload modules (the verifiers:
sympy, math-verify, seconds), and a Ctrl-C in that window printed a ``KeyboardInterrupt`` traceback from
it beside the driver's own one-line stop. Importing this module first closes the window to the interpreter's
start; the workers it forks start with the handlers it held (``forkserver._serve_one`` restores them), so
SIGINT ignored too. SIGTERM, which the driver's ``end_children`` sends, still ends them. The driver's
graceful stop owns Ctrl-C.

The module acts only inside a forkserver (its ``main`` is on the stack): imported anywhere else it changes
nothing.
"""
from __future__ import annotations

import signal
import sys


def in_forkserver() -> bool:
    """Whether this import runs inside ``multiprocessing.forkserver.main`` (its preload)."""
    f = sys._getframe()
    while f is not None:
        if f.f_code.co_name == "main" and f.f_globals.get("__name__") == "multiprocessing.forkserver":
            return True
        f = f.f_back
    return False


if in_forkserver():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
