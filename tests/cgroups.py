"""Memory-capped hosts for tests: a memory cgroup of the test's own, v2 or v1, whichever the machine has.

A test makes one with `memory_cgroup(name, limit)`, starts a process in it (`Server(..., cgroup=...)`
writes the child's pid into it before exec, so the server and every engine it starts count
against the cap) and reads the kernel's own counters: out-of-memory kills and the peak. The folder
is removed when the block ends, failing test or not, after the processes still in it (the test's
own, by pid) are killed. Making one needs root (CI runs as root); where it cannot be made,
`memory_cgroup` raises `CgroupUnavailable` saying why, and the test skips with that reason.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


class CgroupUnavailable(RuntimeError):
    pass


@dataclass
class MemoryCgroup:
    path: Path
    version: int

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs.read_text().split()]
        except OSError:
            return []

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer ended in this cgroup."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        raise CgroupUnavailable(f"{self.path / name} has no oom_kill counter (kernel too old)")

    def peak_bytes(self) -> int:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text().strip())
        except (OSError, ValueError):
            return -1

    def anon_bytes(self) -> int:
        """Anonymous memory in it: what the kernel cannot reclaim (page cache it can)."""
        keys = ("anon",) if self.version == 2 else ("total_rss",)
        for line in (self.path / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key in keys:
                return int(value)
        return self.usage_bytes()

    def usage_bytes(self) -> int:
        name = "memory.current" if self.version == 2 else "memory.usage_in_bytes"
        return int((self.path / name).read_text().strip())


def _kind() -> tuple[int, Path]:
    """(version, the folder new memory cgroups go in)."""
    if (ROOT / "cgroup.controllers").is_file():
        if "memory" not in (ROOT / "cgroup.controllers").read_text().split():
            raise CgroupUnavailable("cgroup v2 without the memory controller")
        return 2, ROOT
    if (ROOT / "memory" / "memory.limit_in_bytes").is_file():
        return 1, ROOT / "memory"
    raise CgroupUnavailable("no memory cgroup controller is mounted under /sys/fs/cgroup")


@contextlib.contextmanager
def memory_cgroup(name: str, limit_bytes: int) -> Iterator[MemoryCgroup]:
    """A fresh memory cgroup `name` capped at `limit_bytes` (no swap), removed afterwards."""
    version, parent = _kind()
    path = parent / name
    try:
        if version == 2:
            control = (parent / "cgroup.subtree_control")
            if "memory" not in control.read_text().split():
                control.write_text("+memory")
        path.mkdir()
        if version == 2:
            (path / "memory.max").write_text(str(limit_bytes))
            with contextlib.suppress(OSError):
                (path / "memory.swap.max").write_text("0")
        else:
            (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
            with contextlib.suppress(OSError):  # no swap accounting on some kernels; there is no swap here either
                (path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
    except OSError as exc:
        raise CgroupUnavailable(f"cannot make the memory cgroup {path}: {exc}") from None
    group = MemoryCgroup(path, version)
    try:
        yield group
    finally:
        _remove(group)


def _remove(group: MemoryCgroup) -> None:
    """Kill what is still in it (the test's own processes, by pid), then remove the folder."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pids = group.pids()
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    while time.monotonic() < deadline:
        try:
            group.path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.2)  # the last processes are still exiting


def join(group: MemoryCgroup) -> None:
    """Move the calling process into the cgroup (a `preexec_fn`: runs in the child before exec)."""
    with open(group.procs, "w") as fh:
        fh.write(str(os.getpid()))
