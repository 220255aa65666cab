"""Server-owned download jobs (`/v1/pull` and `/v1/install` with `stream: true, subscribe: false`) and
their state file.

A job is the server's memory of a download a client asked it to own: its progress, whether it is
paused, cancelled, failed or done. Jobs are saved (atomically) to `downloads.json` in the cache
dir, so after a restart (or a crash) they are listed again, as `paused`, and pulling the model
again resumes from the partial file.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lemonade.util.atomic import atomic_write_json, read_json

log = logging.getLogger("lemonade.downloads")
STATE_FILE = "downloads.json"
COMPLETED_VISIBLE_SECONDS = 30.0
SAVE_INTERVAL = 1.0
PROGRESS_FIELDS = ("file", "file_index", "total_files", "bytes_downloaded", "bytes_total", "total_download_size",
                   "bytes_previously_downloaded", "completed_files_bytes", "cumulative_bytes_downloaded",
                   "percent")


def job_id(name: str, kind: str = "model") -> str:
    """`model:<name>`, or `backend:<recipe>:<backend>` for an engine install."""
    return f"{kind}:{name}"


@dataclass
class Job:
    model_name: str                    # a model's name; `recipe:backend` for a backend install
    status: str = "downloading"        # downloading | paused | cancelled | completed | error
    running: bool = False
    file: str = ""
    file_index: int = 0
    total_files: int = 0
    bytes_downloaded: int = 0
    bytes_total: int = 0
    total_download_size: int = 0
    bytes_previously_downloaded: int = 0
    completed_files_bytes: int = 0
    cumulative_bytes_downloaded: int = 0
    percent: float = 0
    complete: bool = False
    error: str | None = None
    finished_at: float | None = None
    requested: str | None = None       # pause | cancel, while the worker unwinds
    current_model: str | None = None   # the component being pulled (collections)
    kind: str = "model"                # model | backend (an engine install, listed as Lemonade lists it)
    phase: str = ""                    # a backend install's step and what it is doing
    message: str = ""
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def id(self) -> str:
        return job_id(self.model_name, self.kind)

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "type": self.kind, "model_name": self.model_name,
                               "status": self.status, "running": self.running}
        for key in PROGRESS_FIELDS:
            out[key] = getattr(self, key)
        if self.kind == "backend":
            out["phase"], out["message"] = self.phase, self.message
        out["overall_bytes_downloaded"] = self.cumulative_bytes_downloaded
        out["complete"] = self.complete
        if self.error is not None and self.status == "error":
            out["error"] = self.error
        return out

    def apply(self, progress: dict[str, Any]) -> None:
        for key in PROGRESS_FIELDS:
            if key in progress:
                setattr(self, key, progress[key])

    @classmethod
    def restore(cls, data: dict[str, Any]) -> Job | None:
        """A job from the state file; one that was running when the server stopped comes back paused."""
        name = data.get("model_name")
        if not isinstance(name, str) or not name or data.get("type", "model") != "model":
            return None  # an engine install does not resume: it is asked for again (/v1/install)
        job = cls(model_name=name)
        for key in PROGRESS_FIELDS:
            value = data.get(key)
            if isinstance(value, type(getattr(job, key))) or (key == "percent" and isinstance(value, (int, float))):
                setattr(job, key, value)
        status = data.get("status")
        if status == "completed":
            return None  # only shown briefly after completion, not across restarts
        job.status = status if status in ("paused", "cancelled", "error") else "paused"
        job.error = data.get("error") if job.status == "error" else None
        return job


class JobStore:
    def __init__(self, cache_dir: Path) -> None:
        self.path = Path(cache_dir) / STATE_FILE
        self.jobs: dict[str, Job] = {}
        self._last_save = 0.0

    def load(self) -> None:
        try:
            raw = read_json(self.path, [])
        except (OSError, ValueError) as exc:
            log.error("Cannot read %s (%s); previous download jobs are not listed", self.path, exc)
            raw = []
        for item in raw if isinstance(raw, list) else []:
            job = Job.restore(item) if isinstance(item, dict) else None
            if job is not None:
                self.jobs[job.id] = job
        if self.jobs:
            log.info("Restored %d download job(s) from %s (as paused; pull again to resume)", len(self.jobs),
                     self.path)

    def save(self, force: bool = True) -> None:
        now = time.monotonic()
        if not force and now - self._last_save < SAVE_INTERVAL:
            return
        self._last_save = now
        try:
            atomic_write_json(self.path, [j.snapshot() for j in self.jobs.values()])
        except OSError as exc:  # a full disk must not take the download API down
            log.error("Cannot save download jobs to %s: %s", self.path, exc)

    def visible(self) -> list[Job]:
        """Jobs to list; completed ones disappear a little while after they finished."""
        now = time.time()
        expired = [k for k, j in self.jobs.items() if j.status == "completed" and not j.running
                   and j.finished_at is not None and now - j.finished_at > COMPLETED_VISIBLE_SECONDS]
        for key in expired:
            del self.jobs[key]
        if expired:
            self.save()
        return list(self.jobs.values())
