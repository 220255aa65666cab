"""The one logging pipeline: stdlib `logging` under the `lemonade` logger, fanned out to the
console and to a ring buffer of the last 5000 entries that `/logs/stream` serves.

Components log with `logging.getLogger("lemonade.<tag>")`; the tag is the part after the dot
(`router`, `llama-server:Qwen3`, ...). Engine output is logged the same way by the backend
wrappers, so there is only one place where log lines are numbered and stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

RETAINED = 5000
_SEVERITY = {
    logging.DEBUG: "Debug",
    logging.INFO: "Info",
    logging.WARNING: "Warning",
    logging.ERROR: "Error",
    logging.CRITICAL: "Fatal",
}
TRACE = 5
logging.addLevelName(TRACE, "TRACE")


def _put_all(queue: asyncio.Queue[LogEntry], entries: list[LogEntry]) -> None:
    """A subscriber 10000 entries behind loses the newest rather than raising in the event loop."""
    with contextlib.suppress(asyncio.QueueFull):
        for entry in entries:
            queue.put_nowait(entry)


@dataclass
class LogEntry:
    seq: int
    timestamp: str
    severity: str
    tag: str
    line: str


def _format_ts(created: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created)) + f".{int(created % 1 * 1000):03d}"


class LogBuffer(logging.Handler):
    """Numbers every record, keeps the last `RETAINED` and pushes new ones to live subscribers."""

    def __init__(self, capacity: int = RETAINED) -> None:
        super().__init__(level=logging.DEBUG)
        self._entries: deque[LogEntry] = deque(maxlen=capacity)
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self._subscribers: set[tuple[asyncio.AbstractEventLoop, asyncio.Queue[LogEntry]]] = set()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tag = record.name.split(".", 1)[1] if "." in record.name else record.name
            severity = "Trace" if record.levelno <= TRACE else _SEVERITY.get(record.levelno, "Info")
            message = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                message += f": {record.exc_info[1]!r}"
            self.add(tag, severity, message, record.created)
        except Exception:  # a log handler must never raise into the code that logs
            self.handleError(record)

    def add(self, tag: str, severity: str, message: str, created: float | None = None) -> None:
        """Store one entry and push it to subscribers."""
        self.add_many(tag, severity, (message,), created)

    def add_many(self, tag: str, severity: str, messages: Iterable[str], created: float | None = None) -> None:
        """Store entries that arrived together (an engine's lines read in one chunk) under one
        timestamp, one lock and one wake-up per subscriber. Engine output comes here directly: a
        LogRecord per engine line cost about 0.4 ms per request, and one call per line still about
        0.2 ms of the lines llama-server prints per request (docs/performance.md)."""
        ts = _format_ts(time.time() if created is None else created)
        with self._lock:
            entries = [LogEntry(next(self._seq), ts, severity, tag, f"{ts} [{severity}] ({tag}) {m}") for m in messages]
            self._entries.extend(entries)
            subscribers = list(self._subscribers)
        for loop, queue in subscribers:
            try:
                loop.call_soon_threadsafe(_put_all, queue, entries)
            except RuntimeError:  # loop closed: the subscriber is gone
                pass

    def snapshot(self, after_seq: int | None = None) -> list[dict[str, Any]]:
        with self._lock:
            entries = list(self._entries)
        return [asdict(e) for e in entries if after_seq is None or e.seq > after_seq]

    def subscribe(self) -> asyncio.Queue[LogEntry]:
        queue: asyncio.Queue[LogEntry] = asyncio.Queue(maxsize=10000)
        with self._lock:
            self._subscribers.add((asyncio.get_running_loop(), queue))
        return queue

    def unsubscribe(self, queue: asyncio.Queue[LogEntry]) -> None:
        with self._lock:
            self._subscribers = {s for s in self._subscribers if s[1] is not queue}


def log_buffer() -> LogBuffer | None:
    """The ring buffer attached to the `lemonade` logger, if logging was set up."""
    for handler in logging.getLogger("lemonade").handlers:
        if isinstance(handler, LogBuffer):
            return handler
    return None


def level_number(name: str) -> int:
    """A `log_level` setting as a logging level: Lemonade's names (trace ... fatal, none) included."""
    lowered = name.lower()
    if lowered == "trace":
        return TRACE
    if lowered == "none":
        return logging.CRITICAL + 10
    return getattr(logging, lowered.upper(), logging.INFO)


def setup_logging(level: str = "info") -> LogBuffer:
    """Attach the console and ring-buffer handlers to the `lemonade` logger (idempotent)."""
    root = logging.getLogger("lemonade")
    for handler in list(root.handlers):
        root.removeHandler(handler)
    numeric = level_number(level)
    root.setLevel(numeric)
    root.propagate = False
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] (%(name)s) %(message)s"))
    if numeric > logging.DEBUG:
        # Engines are chatty: their output goes to /logs/stream, and to the console only when debugging.
        console.addFilter(lambda record: not record.name.startswith("lemonade.engine."))
    root.addHandler(console)
    buffer = LogBuffer()
    root.addHandler(buffer)
    return buffer
