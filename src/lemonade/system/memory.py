"""The memory this server may use: one budget, read afresh at each decision.

The budget is the smallest of three figures (docs/memory.md):
- the machine's physical RAM;
- the limit of the memory cgroup the server runs in (cgroup v2 `memory.max`, or v1
  `memory.limit_in_bytes`, the smallest on the way up the hierarchy: a container's or a systemd
  unit's cap), less the anonymous memory the rest of the cgroup holds (the server process itself,
  other programs; page cache is not counted: the kernel drops it before it kills anything);
- what is actually free: the kernel's `MemAvailable`, plus what our own engines hold (they are
  ours to account for, not someone else's).

The catalog's hardware filter, `ctx_size: -1` and load admission all read this one budget, so a
container with 4 GiB on a 64 GiB host is sized as 4 GiB everywhere. The cgroup's out-of-memory kill
counter (v2 `memory.events` `oom_kill`, v1 `memory.oom_control` `oom_kill`) tells a kill by the
kernel from any other death of an engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

CGROUP_ROOT = Path("/sys/fs/cgroup")
RESERVE_FRACTION = 0.05
RESERVE_MIN_BYTES = 32 << 20
UNLIMITED = 1 << 60  # v1 reports "no limit" as a huge page-aligned number (9223372036854771712)
Source = Literal["ram", "available", "cgroup"]  # the figure that sets the budget


@dataclass(frozen=True)
class CgroupMemory:
    """The memory cgroup the server runs in, as the kernel reports it now."""

    version: int  # 1 or 2
    path: Path  # its folder under /sys/fs/cgroup
    limit_bytes: int | None  # the smallest limit on the way up; None: no limit
    usage_bytes: int  # charged to it, page cache included
    inactive_file_bytes: int  # page cache the kernel reclaims first (not counted as in use)
    anon_bytes: int  # anonymous memory: what no reclaim can free (there is no swap to count on)
    oom_kills: int | None  # processes the kernel's OOM killer ended in it

    @property
    def working_set_bytes(self) -> int:
        """What it holds that cannot simply be dropped (Kubernetes' working set: usage less
        inactive page cache)."""
        return max(0, self.usage_bytes - self.inactive_file_bytes)


@dataclass(frozen=True)
class MemoryBudget:
    ram_bytes: int
    available_bytes: int  # MemAvailable
    cgroup: CgroupMemory | None
    engines_bytes: int  # what our engine processes hold now (measured: PSS)
    engines_anon_bytes: int = 0  # the anonymous part of it

    @property
    def cap_bytes(self) -> int:
        """The most the server could ever use here: RAM, or the cgroup's limit when that is lower
        (what the catalog's hardware filter compares a model with)."""
        limit = self.cgroup.limit_bytes if self.cgroup is not None else None
        return min(self.ram_bytes, limit) if limit is not None else self.ram_bytes

    def _terms(self) -> dict[Source, int]:
        terms: dict[Source, int] = {"ram": self.ram_bytes, "available": self.available_bytes + self.engines_bytes}
        if self.cgroup is not None and self.cgroup.limit_bytes is not None:
            others = max(0, self.cgroup.anon_bytes - self.engines_anon_bytes)  # the server itself and the rest
            terms["cgroup"] = max(0, self.cgroup.limit_bytes - others)
        return terms

    @property
    def budget_bytes(self) -> int:
        """What our engines may hold together now: the smallest of the three figures."""
        return min(self._terms().values())

    @property
    def admissible_bytes(self) -> int:
        """The budget less a reserve (RESERVE_FRACTION of the cap, at least RESERVE_MIN_BYTES) for the
        server's own growth and the estimates' error: what loads are admitted against."""
        return max(0, self.budget_bytes - max(RESERVE_MIN_BYTES, int(RESERVE_FRACTION * self.cap_bytes)))

    @property
    def source(self) -> Source:
        """Which figure set the budget."""
        terms = self._terms()
        return min(terms, key=lambda k: (terms[k], k != "cgroup"))

    def describe(self) -> dict[str, object]:
        limit = self.cgroup.limit_bytes if self.cgroup is not None else None
        return {"memory_budget_gb": round(self.budget_bytes / 2**30, 3), "memory_budget_source": self.source,
                "memory_cap_gb": round(self.cap_bytes / 2**30, 3),
                "cgroup_memory_limit_gb": round(limit / 2**30, 3) if limit is not None else None,
                "cgroup_version": self.cgroup.version if self.cgroup is not None else None}


# ----- reading the kernel ----------------------------------------------------------------------------------
def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _number(text: str | None) -> int | None:
    if text is None or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= UNLIMITED else value


def _stat(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (_read(path) or "").splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def _own_paths(pid: str) -> tuple[str | None, str | None]:
    """(v2 path, v1 memory path) of a process's cgroups, from /proc/<pid>/cgroup."""
    v2 = v1 = None
    for line in (_read(Path(f"/proc/{pid}/cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _v2(rel: str, root: Path) -> CgroupMemory | None:
    folder = root / rel.lstrip("/")
    if not (folder / "memory.current").is_file():
        return None
    limits = []
    probe = folder
    while True:  # a parent's limit binds the children too
        limit = _number(_read(probe / "memory.max"))
        if limit is not None:
            limits.append(limit)
        if probe == root or root not in probe.parents:
            break
        probe = probe.parent
    stat = _stat(folder / "memory.stat")
    events = _stat(folder / "memory.events")
    anon = stat.get("anon", 0) + stat.get("shmem", 0)
    return CgroupMemory(2, folder, min(limits) if limits else None, _number(_read(folder / "memory.current")) or 0,
                        stat.get("inactive_file", 0), anon, events.get("oom_kill"))


def _v1(rel: str, root: Path) -> CgroupMemory | None:
    folder = root / "memory" / rel.lstrip("/")
    if not (folder / "memory.usage_in_bytes").is_file():
        return None
    stat = _stat(folder / "memory.stat")
    # v1 states the effective limit (the smallest on the way up) itself
    limit = _number(str(stat["hierarchical_memory_limit"])) if "hierarchical_memory_limit" in stat else \
        _number(_read(folder / "memory.limit_in_bytes"))
    oom = _stat(folder / "memory.oom_control")
    anon = stat.get("total_rss", stat.get("rss", 0)) + stat.get("total_shmem", stat.get("shmem", 0))
    return CgroupMemory(1, folder, limit, _number(_read(folder / "memory.usage_in_bytes")) or 0,
                        stat.get("total_inactive_file", stat.get("inactive_file", 0)), anon, oom.get("oom_kill"))


def cgroup_memory(pid: int | str = "self", root: Path = CGROUP_ROOT) -> CgroupMemory | None:
    """The memory cgroup of a process (this one by default), or None where none can be read (not
    Linux, no memory controller mounted)."""
    v2, v1 = _own_paths(str(pid))
    if v1 is not None:  # a hybrid machine keeps the memory controller on v1
        found = _v1(v1, root)
        if found is not None:
            return found
    return _v2(v2, root) if v2 is not None else None


def _meminfo() -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes."""
    fields = {}
    for line in (_read(Path("/proc/meminfo")) or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[key] = int(parts[0]) * 1024
    if "MemTotal" in fields:
        return fields["MemTotal"], fields.get("MemAvailable", fields.get("MemFree", 0))
    import psutil  # not Linux: what psutil knows

    vm = psutil.virtual_memory()
    return vm.total, vm.available


def read_budget(engines_bytes: int = 0, engines_anon_bytes: int = 0) -> MemoryBudget:
    """The budget now; `engines_bytes` (and its anonymous part): what our engine processes hold (the
    router measures them)."""
    total, available = _meminfo()
    return MemoryBudget(total, available, cgroup_memory() if os.name == "posix" else None, max(0, engines_bytes),
                        max(0, engines_anon_bytes))


def process_tree_memory(pid: int) -> tuple[int, int] | None:
    """(memory, its anonymous part) of a process and its children: PSS (shared pages split between
    their users) where /proc/<pid>/smaps_rollup is readable, else RSS; anonymous is resident less
    file-backed and shared pages. None when the process is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = anon = 0
    for proc in procs:
        try:
            info = proc.memory_info()
            anon += max(0, info.rss - info.shared)
            try:
                total += proc.memory_full_info().pss
            except (psutil.AccessDenied, AttributeError):
                total += info.rss
        except psutil.Error:
            continue
    return total, anon
