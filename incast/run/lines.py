"""Reading what a run's child processes say, line by line, without waiting forever."""
from __future__ import annotations

import os
import selectors

from incast.errors import RunFailed

STALL_TIMEOUT_S = 300   # no output from a child for this long: the run is wedged


class Lines:
    """Line reader over a child's stdout with a stall detector. It reads the pipe itself:
    a buffered file object would hold lines that already arrived where select() cannot
    see them, and wait for more output that may never come."""

    def __init__(self, proc, what):
        self.proc, self.what = proc, what
        self.fd = proc.stdout.fileno()
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.fd, selectors.EVENT_READ)
        self.pending = b""

    def next(self) -> str:
        while b"\n" not in self.pending:
            if not self.sel.select(STALL_TIMEOUT_S):
                raise RunFailed(f"{self.what} produced nothing for {STALL_TIMEOUT_S} s")
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                self.proc.wait()
                err = self.proc.stderr.read().strip().splitlines() if self.proc.stderr else []
                raise RunFailed(f"{self.what} exited ({self.proc.returncode}): "
                                f"{err[-1] if err else 'no error output'}")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode(errors="replace").rstrip("\r")

    def expect(self, word: str) -> None:
        line = self.next()
        if line != word:
            raise RunFailed(f"{self.what}: expected {word}, got {line!r}")
