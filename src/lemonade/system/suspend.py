"""Keeping the machine awake while a model works (`inhibit_suspend`, guide-configuration-README.md).

Lemonade holds a systemd-logind inhibitor lock ("sleep:idle", mode "block") while inference runs and
drops it when the server is idle, so a laptop does not suspend in the middle of a long generation;
elsewhere (Windows, macOS, machines without logind) the setting does nothing. Lemonade's server asks
logind over D-Bus; we take the same lock through `systemd-inhibit`, which ships with systemd wherever
logind runs, so no D-Bus library is needed. The lock lasts as long as the command systemd-inhibit
runs for us: a `cat` reading a pipe from this process. Closing the pipe ends it, and so does this
process dying in any way (the pipe closes with it), so a lock can never outlive the server.

Where logind is absent (a container, WSL, a system without systemd) systemd-inhibit fails at once:
that is said once in the log, and no lock is tried again until the server restarts.

`SuspendGuard` decides when: it reads the router's busy state (`busy`, nothing queued, loading or
in flight) every `WATCH_SECONDS` while models are loaded, and stops watching when none is, so an
idle server with nothing loaded never wakes for it. A request shorter than that may end before the
lock is taken; logind's idle timers are minutes, so it would not have suspended meanwhile anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable

log = logging.getLogger("lemonade.suspend")

PROGRAM = "systemd-inhibit"
# What is blocked, and what `systemd-inhibit --list` shows as who and why (Lemonade's words).
INHIBIT_ARGS = ["--what=sleep:idle", "--who=lemonade", "--why=Inference in progress", "--mode=block"]
# The command the lock is held for: says it runs (systemd-inhibit starts it only once the lock is
# taken), then waits for our end of the pipe to close.
HOLDER = ["sh", "-c", "echo held && exec cat"]
TAKE_SECONDS = 10.0  # a lock not confirmed by then is given up
WATCH_SECONDS = 1.0


class SuspendInhibitor:
    """One logind inhibitor lock, taken and dropped on request."""

    def __init__(self, program: str = PROGRAM) -> None:
        self.program = program
        self.unavailable: str | None = None  # why no lock can be taken here (said once in the log)
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def held(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def hold(self) -> bool:
        """Take the lock unless it is held; False when it cannot be taken here."""
        if self.held:
            return True
        if self.unavailable is not None:
            return False
        if not sys.platform.startswith("linux"):
            return self._give_up("suspend inhibition uses systemd-logind, which only Linux has", level=logging.DEBUG)
        try:
            proc = await asyncio.create_subprocess_exec(
                self.program, *INHIBIT_ARGS, *HOLDER, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except OSError as exc:
            return self._give_up(f"{self.program} cannot be run ({exc}); it comes with systemd, whose logind takes "
                                 "the lock")
        assert proc.stdout is not None
        try:
            first = await asyncio.wait_for(proc.stdout.readline(), TAKE_SECONDS)
        except TimeoutError:
            first = b""
        if first.strip() != b"held":
            await _end(proc)
            said = (await proc.stderr.read()).decode(errors="replace").strip() if proc.stderr else ""
            return self._give_up(f"{self.program} could not take the lock: {said or f'exit code {proc.returncode}'}")
        self._proc = proc
        log.debug("Holding a sleep:idle inhibitor lock while inference runs (%s pid %d)", self.program, proc.pid)
        return True

    async def release(self) -> None:
        """Drop the lock, if held."""
        proc, self._proc = self._proc, None
        if proc is not None:
            await _end(proc)
            log.debug("Released the sleep:idle inhibitor lock: the server is idle")

    def _give_up(self, why: str, level: int = logging.INFO) -> bool:
        self.unavailable = why
        log.log(level, "inhibit_suspend: the OS may suspend while a model works: %s. This is expected where "
                "systemd-logind does not run (containers, WSL); `lemonade config set inhibit_suspend=false` stops "
                "the attempt.", why)
        return False


async def _end(proc: asyncio.subprocess.Process) -> None:
    """Close the holder's pipe (its `cat` ends, and systemd-inhibit with it); killed if it lingers."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), 5.0)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


class SuspendGuard:
    """Holds the inhibitor while `busy()` and `enabled()` say so, watching only while `watching()`."""

    def __init__(self, inhibitor: SuspendInhibitor, *, busy: Callable[[], bool], enabled: Callable[[], bool],
                 watching: Callable[[], bool]) -> None:
        self.inhibitor = inhibitor
        self.busy = busy
        self.enabled = enabled
        self.watching = watching
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Something changed (a model loaded): watch, unless already watching."""
        if self._task is None or self._task.done():
            with contextlib.suppress(RuntimeError):  # no running loop: nothing to watch yet
                self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            if self.enabled() and self.busy():
                await self.inhibitor.hold()
            else:
                await self.inhibitor.release()
                if not self.watching():
                    return
            await asyncio.sleep(WATCH_SECONDS)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.inhibitor.release()
