"""A one-line progress display on stderr, shown only when stderr is a terminal.

Used for work a person waits on (analysing a long run, rendering plots); in pipes, logs and
Slurm job output it writes nothing, so those stay clean."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        if enabled is None:
            try:
                enabled = self.stream.isatty()
            except (AttributeError, ValueError):
                enabled = False
        self.enabled = enabled
        self.t0 = time.monotonic()
        self._last = ""

    def update(self, what: str, done: int | None = None, total: int | None = None) -> None:
        if not self.enabled:
            return
        frac = f" {done}/{total}" if done is not None and total else ""
        line = f"reveal: {what}{frac}  [{time.monotonic() - self.t0:4.1f} s]"
        self.stream.write("\r\x1b[2K" + line[:200])
        self.stream.flush()
        self._last = line

    def done(self) -> None:
        if self.enabled and self._last:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self._last = ""

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.done()
