"""The Job Engine API (api-lemonade.md "Job Engine API"; upstream docs/dev/job-system.md).

`POST /jobs` creates a job (202 `{"id"}`, 400 naming the bad step and field, 429 when the store is
full), `GET /jobs` lists summaries, `GET /jobs/{id}` is the full record, `pause` / `interrupt` /
`resume` move it (409 from a state that does not allow it), `DELETE` removes it; an unknown id is
a 404. `GET /jobs/{id}/events` streams the job's progress as SSE `job` events until it stops
being active (the same changes are logged, so `/logs/stream` shows them too).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, StreamingResponse

from lemonade.api.lemonade.job_protocol import JobCreated
from lemonade.api.openapi import STREAM_SCHEMAS
from lemonade.jobs.manager import JobManager

router = APIRouter(tags=["jobs"])


def jobs(request: Request) -> JobManager:
    return request.app.state.jobs


@router.post("/jobs", status_code=202, response_model=None, responses={202: {
    "model": JobCreated, "description": "Created; the job runs in the background"}})
async def create_job(request: Request, body: Any = Body(..., examples=[{
        "name": "hello", "inputs": {"ms": 10},
        "steps": [{"id": "nap", "op": "sleep", "params": {"ms": "${inputs.ms}"}},
                  {"id": "stats", "op": "system_stats", "when": "${inputs.ms} < 100",
                   "extract": {"memory": "memory_gb"}}]}])) -> JSONResponse:
    """Create a job from `{name, steps | definition: {steps}, inputs}`; it runs in the background."""
    return JSONResponse({"id": jobs(request).create(body)}, status_code=202)


@router.get("/jobs")
async def list_jobs(request: Request) -> dict[str, Any]:
    """Job summaries, newest first: status, `progress` {cursor, completed, step_count}."""
    return {"jobs": jobs(request).list()}


@router.get("/jobs/{job_id}")
async def get_job(request: Request, job_id: str) -> dict[str, Any]:
    """The full record: status, cursor, per-step state and output, the context."""
    return jobs(request).get(job_id)


@router.get("/jobs/{job_id}/events", response_class=StreamingResponse, responses={200: {
    "description": "SSE `job` events: the job's summary and per-step status",
    "content": {"text/event-stream": {"schema": STREAM_SCHEMAS["text/event-stream"]}}}})
async def job_events(request: Request, job_id: str) -> StreamingResponse:
    """SSE: one `job` event with the job's state now, then one per change, until it is no longer
    queued or running (paused, interrupted, completed, failed, or deleted)."""
    source = jobs(request).events(job_id)
    first = await anext(source)  # an unknown id is a 404 before the stream starts

    async def stream() -> AsyncIterator[bytes]:
        yield f"event: job\ndata: {json.dumps(first)}\n\n".encode()
        async for snapshot in source:
            yield f"event: job\ndata: {json.dumps(snapshot)}\n\n".encode()

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.post("/jobs/{job_id}/pause")
async def pause_job(request: Request, job_id: str) -> dict[str, Any]:
    """Stop after the current step (a queued job is paused at once)."""
    return jobs(request).pause(job_id)


@router.post("/jobs/{job_id}/interrupt")
async def interrupt_job(request: Request, job_id: str) -> dict[str, Any]:
    """Cancel the current step now; the job is resumable and re-runs that step."""
    return jobs(request).interrupt(job_id)


@router.post("/jobs/{job_id}/resume")
async def resume_job(request: Request, job_id: str) -> dict[str, Any]:
    """Continue a paused or interrupted job."""
    return jobs(request).resume(job_id)


@router.delete("/jobs/{job_id}")
async def delete_job(request: Request, job_id: str) -> dict[str, Any]:
    """Remove a job; a running one is stopped first and the models it loaded are unloaded."""
    return jobs(request).delete(job_id)
