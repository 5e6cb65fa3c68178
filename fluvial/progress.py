"""Progress of long work: a bar for command-line tools, log lines for the broker.

`cli_progress` draws a rich progress bar on stderr when it is a terminal (and prints
nothing extra otherwise, so scripts and CI logs stay clean). `ProgressLog` is the
broker's form: a log line at most every few seconds with done/total, rate and time
left, and one when the work ends, so a long recovery or restore is never silent.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field


class _Bar:
    def __init__(self, progress, task) -> None:
        self._progress = progress
        self._task = task

    def advance(self, amount: float = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, amount)

    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None:
        if self._progress is not None:
            kwargs = {k: v for k, v in (("completed", completed), ("total", total), ("description", description))
                      if v is not None}
            self._progress.update(self._task, **kwargs)


@contextlib.contextmanager
def cli_progress(description: str, total: float | None, unit: str = "rows", *,
                 enabled: bool | None = None) -> Iterator[_Bar]:
    """A progress bar for a command-line tool: `with cli_progress("copy", n) as bar: bar.advance(k)`.

    `enabled=None`: shown when stderr is a terminal. `total=None`: an open-ended count."""
    show = sys.stderr.isatty() if enabled is None else enabled
    if not show:
        yield _Bar(None, None)
        return
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn(unit), TaskProgressColumn(), TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=Console(stderr=True), transient=False) as progress:
        yield _Bar(progress, progress.add_task(description, total=total))


@dataclass
class ProgressLog:
    """Log lines for long work inside the broker: `update(done)` as it goes, `finish()` at the end."""

    log: logging.Logger
    what: str
    total: int | None
    unit: str = "items"
    every_s: float = 2.0
    done: int = 0
    _started: float = field(default_factory=time.monotonic)
    _last: float = field(default_factory=time.monotonic)

    def update(self, done: int) -> None:
        self.done = done
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self.log.info("%s: %s", self.what, self.describe(now))

    def advance(self, amount: int = 1) -> None:
        self.update(self.done + amount)

    def finish(self, note: str = "") -> None:
        self.log.info("%s: done, %s%s", self.what, self.describe(time.monotonic()), f" ({note})" if note else "")

    def describe(self, now: float) -> str:
        elapsed = max(now - self._started, 1e-9)
        rate = self.done / elapsed
        if self.total:
            left = (self.total - self.done) / rate if rate > 0 else None
            eta = f", about {left:.0f} s left" if left is not None and self.done < self.total else ""
            return (f"{self.done:,}/{self.total:,} {self.unit} ({100 * self.done / self.total:.0f}%) in "
                    f"{elapsed:.1f} s, {rate:,.0f} {self.unit}/s{eta}")
        return f"{self.done:,} {self.unit} in {elapsed:.1f} s, {rate:,.0f} {self.unit}/s"
