"""``argparse`` parsers whose usage errors are one line (the project rule for every user error).

argparse's own ``error`` prints the whole usage block and then the message; with many options the
message ends up below a dozen lines of usage. Here it is one line naming the command, the problem and
where the options are listed: ``megatron-rl train: error: ... (see 'megatron-rl train --help')``.
Exit status stays argparse's 2.
"""
from __future__ import annotations

import argparse
import sys


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors print one line (subparsers inherit the class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def exit(self, status: int = 0, message: str | None = None):
        if message:
            sys.stderr.write(message)
        raise SystemExit(status)
