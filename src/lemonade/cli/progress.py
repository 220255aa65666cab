"""Progress display for long operations (a backend install takes ~10 minutes when it builds).

Takes the `{"phase", "message", "percent"}` events that both the installer callback and the
`/v1/install` SSE stream produce, so the local and the server path look the same. On a terminal
it is a live rich progress bar; elsewhere (CI logs, pipes) it prints a line when the phase
changes or the percentage moves on, instead of hundreds of compiler lines.
"""

from __future__ import annotations

import time
from typing import Any

from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from lemonade.cli.common import err

PLAIN_STEP = 5.0  # percent between plain lines
PLAIN_QUIET = 15.0  # seconds without a line before the current message is printed anyway


class ProgressView:
    def __init__(self, title: str) -> None:
        self.title = title
        self.live = err.is_terminal
        self._progress: Progress | None = None
        self._task: Any = None
        self._phase: str | None = None
        self._last_pct = -PLAIN_STEP
        self._last_line = 0.0

    def __enter__(self) -> ProgressView:
        err.print(escape(self.title), highlight=False)
        if self.live:
            self._progress = Progress(
                SpinnerColumn(), TextColumn("[bold]{task.fields[phase]:<9}"), BarColumn(bar_width=30),
                TaskProgressColumn(), TimeElapsedColumn(), TextColumn("{task.description}"), console=err)
            self._progress.start()
            self._task = self._progress.add_task("", total=None, phase="starting")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, event: dict[str, Any]) -> None:
        phase = str(event.get("phase") or "")
        message = str(event.get("message") or "")
        pct = event.get("percent")
        pct = float(pct) if isinstance(pct, (int, float)) else None
        if self._progress is not None:
            room = max(20, err.width - 65)
            short = message if len(message) <= room else message[: room - 3] + "..."
            self._progress.update(self._task, description=escape(short), phase=phase or "working",
                                  total=100 if pct is not None else None,
                                  completed=pct if pct is not None else 0)
            return
        now = time.monotonic()
        changed = phase != self._phase
        if changed:
            self._last_pct = -PLAIN_STEP
        moved = pct is not None and pct >= self._last_pct + PLAIN_STEP
        if changed or moved or phase == "done" or now - self._last_line >= PLAIN_QUIET:
            suffix = f" ({pct:.0f}%)" if pct is not None else ""
            err.print(f"[{phase}] {message}{suffix}", highlight=False, markup=False)
            self._phase = phase
            self._last_line = now
            if pct is not None:
                self._last_pct = pct
