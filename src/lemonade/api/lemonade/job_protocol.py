"""What the Job Engine routes answer, for `/openapi.json` (api/responses.py says why answers are only
documented, not validated). Named fields are always sent; the rest may follow."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

JobState = Literal["queued", "running", "paused", "interrupted", "completed", "failed"]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="allow")


class JobCreated(_Doc):
    id: str


class JobProgress(_Doc):
    cursor: str
    completed: int
    step_count: int


class JobSummary(_Doc):
    id: str
    name: str
    status: JobState
    created_at: str
    progress: JobProgress
    started_at: str | None = None
    finished_at: str | None = None
    error: str | None = None


class JobList(_Doc):
    jobs: list[JobSummary]


class JobStep(_Doc):
    id: str
    op: str
    params: dict[str, Any]
    status: Literal["pending", "running", "completed", "failed", "skipped"]
    duration_ms: int
    error: str | None = None
    output: Any = None


class JobRecord(JobSummary):
    inputs: dict[str, Any]
    context: dict[str, Any]
    cursor: str
    steps: list[JobStep]


class JobAction(_Doc):
    status: Literal["pausing", "paused", "interrupting", "interrupted", "resuming"]
    job: JobSummary


class JobDeleted(_Doc):
    status: Literal["deleted"]
    id: str
