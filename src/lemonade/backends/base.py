"""WrappedServer: one inference engine process serving one model on a private loopback port.

The process runs in its own process group with PR_SET_PDEATHSIG, so stopping it kills anything
it spawned and a server that dies (even by SIGKILL) takes its engines with it: no orphans. Its
output goes line by line into the log pipeline, tagged with the model name.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import logging
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import httpx

from lemonade.observability.logs import log_buffer
from lemonade.util.http_client import async_client
from lemonade.util.process_group import signal_group

_PR_SET_PDEATHSIG = 1
ENGINE_TAG_PREFIX = "engine."  # engine output: kept in the log buffer, shown on the console only at debug
OUTPUT_GATHER_S = 0.05  # how long engine output lines may gather before they are read (see _pump_output)
# How often a starting engine is asked whether it is ready: half of it is, on average, added to every
# load (a swap's included); a poll costs our loop 0.4 ms of CPU and the engine too little to measure.
READY_POLL_S = 0.02


def _die_with_parent() -> None:
    """Runs in the child before exec: ask the kernel to SIGKILL us when the server goes away."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


async def _readable(fd: int) -> None:
    """Until `fd` has something to read (or is at its end)."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


def _read_available(fd: int, limit: int = 1 << 20) -> tuple[bytes, bool]:
    """What a non-blocking `fd` holds now (up to `limit`), and whether its writers are all gone."""
    parts: list[bytes] = []
    size = 0
    while size < limit:
        try:
            part = os.read(fd, 65536)
        except BlockingIOError:
            return b"".join(parts), False
        if not part:
            return b"".join(parts), True
        parts.append(part)
        size += len(part)
    return b"".join(parts), False


class BackendStartError(RuntimeError):
    """The engine did not come up; the message carries its last output lines."""


class WrappedServer:
    def __init__(self, name: str, argv: list[str], port: int, *, health_path: str = "/health",
                 env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.name = name
        self.argv = argv
        self.port = port
        self.health_path = health_path
        self.env = env
        self.cwd = cwd
        self.proc: asyncio.subprocess.Process | None = None
        self.log = logging.getLogger(f"lemonade.{name}")  # lifecycle: starting, ready, crashed
        self.output_log = logging.getLogger(f"lemonade.{ENGINE_TAG_PREFIX}{name}")
        self.tail: deque[str] = deque(maxlen=40)
        self.started_at = 0.0
        self._pump: asyncio.Task[None] | None = None
        self._stopping = False
        self.on_exit: Callable[[WrappedServer, int], None] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self, timeout: float = 300.0) -> None:
        self.log.info("Starting: %s", " ".join(self.argv))
        self.started_at = time.time()
        # The output pipe is ours, not an asyncio transport's: a transport reads whatever arrives
        # at once, and llama-server writes each line in three pieces (time, level, text), so about
        # 25 wake-ups per request. `_pump_output` reads it at most every OUTPUT_GATHER_S instead.
        out_fd, in_fd = os.pipe()
        with contextlib.suppress(OSError, AttributeError):  # room for 50 ms of a chatty engine (Linux)
            fcntl.fcntl(in_fd, fcntl.F_SETPIPE_SZ, 1 << 20)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.DEVNULL, stdout=in_fd, stderr=asyncio.subprocess.STDOUT,
                env=self.env, cwd=self.cwd, start_new_session=True, preexec_fn=_die_with_parent)
        except BaseException:
            os.close(out_fd)
            raise
        finally:
            os.close(in_fd)
        os.set_blocking(out_fd, False)
        self._pump = asyncio.create_task(self._pump_output(out_fd))
        try:
            await self._wait_ready(timeout)
        except BaseException:
            await self.stop()
            raise
        self.log.info("Ready on %s (pid %s) after %.1fs", self.base_url, self.pid, time.time() - self.started_at)

    async def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        async with async_client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if not self.alive:
                    await self._drained()
                    raise BackendStartError(
                        f"{self.name} exited with code {self.proc.returncode if self.proc else '?'} while "
                        f"starting. Last output:\n" + "\n".join(self.tail))
                try:
                    resp = await client.get(self.base_url + self.health_path)
                    if resp.status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(READY_POLL_S)
        raise BackendStartError(f"{self.name} did not become ready within {timeout:.0f}s. Last output:\n"
                                + "\n".join(self.tail))

    async def _drained(self, bound: float = 2.0) -> None:
        """Wait until the output pump has read everything the engine wrote (it ends at the pipe's
        end), so its last lines are in `tail`; bounded, since a child of the engine may hold the pipe."""
        if self._pump is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._pump), bound)

    async def _pump_output(self, fd: int) -> None:
        """Engine output into the log ring buffer (and `tail`), in chunks of lines."""
        assert self.proc is not None
        tag = self.output_log.name.split(".", 1)[1]
        buffer = log_buffer()
        pending = b""
        try:
            while True:
                # Everything there is, not lines: a very long line must never stall the pipe (and so the engine).
                chunk, ended = _read_available(fd)
                if not chunk and not ended:  # quiet: wait for the engine to say something
                    await _readable(fd)
                    continue
                # A carriage return ends a line too: progress bars (sd.cpp's steps) redraw with "\r".
                *lines, pending = (pending + chunk).replace(b"\r", b"\n").split(b"\n")
                if ended or len(pending) > 65536:  # at the end, a last line without its newline counts too
                    lines, pending = lines + [pending], b""
                decoded = (line.decode("utf-8", errors="replace").replace("\x1b[K", "").rstrip() for line in lines)
                texts = [text for text in decoded if text]
                self.tail.extend(texts)
                if buffer is None or self.output_log.isEnabledFor(logging.DEBUG):
                    for text in texts:
                        self.output_log.info("%s", text)  # debugging: through logging, to the console too
                elif texts:
                    buffer.add_many(tag, "Info", texts)
                if ended:
                    break
                # An engine writes its lines in pieces (llama-server about 25 per request); a wake-up
                # per piece cost more than storing them. Letting them gather for a moment reads them in
                # one chunk; the pipe holds far more than an engine writes meanwhile (1 MB where the
                # system allows, else 64 KB; a full pipe only makes the engine wait for the next read).
                await asyncio.sleep(OUTPUT_GATHER_S)
        finally:
            os.close(fd)
        code = await self.proc.wait()
        if not self._stopping:
            self.log.error("Process %s exited unexpectedly with code %s. Last output:\n%s", self.pid, code,
                           "\n".join(list(self.tail)[-10:]))
            if self.on_exit:
                self.on_exit(self, code)

    async def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds, and reap it."""
        self._stopping = True
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None:
            self.log.info("Stopping pid %s", proc.pid)
            signal_group(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), grace)
            except TimeoutError:
                signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
        # The group may hold helpers that outlived the leader.
        signal_group(proc.pid, signal.SIGKILL)
        if self._pump:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._pump, 2.0)

    def kill_now(self, report: bool = False) -> None:
        """SIGKILL at once: the last resort at interpreter exit, or the watchdog's cure for a hung
        engine (`report=True`: its exit is then reported like a crash)."""
        self._stopping = not report
        if self.proc is not None:
            signal_group(self.proc.pid, signal.SIGKILL)
