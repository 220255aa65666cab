"""The job engine: durable background jobs of server operations (upstream docs/dev/job-system.md).

One worker runs one job at a time, step by step: a step's `when` may skip it, its `params` are
resolved against the context, its op runs, its output lands in `context[<step id>]` (and
`extract` copies fields to top-level keys), then `branch` / `on_done` / list order pick the next
step, or `on_fail` on failure. A job whose steps touch models (`exclusive` ops) closes the
router's gate while it runs (runtime/exclusive.py), so other traffic queues behind it.

Lifecycle: queued -> running -> paused | interrupted | completed | failed. Pause stops after the
current step and releases the gate (models the job loaded stay, still the job's); interrupt
aborts the current step now (its engine request is cancelled through the same "client gone"
signal a departing HTTP client triggers), unloads the models the job itself loaded, and leaves
the step pending; resume re-runs from the cursor, first reloading those models. Delete writes a
tombstone first, then cleans up and forgets the job.

Every change is written atomically to `<config dir>/jobs.json`; after a restart a job that was
running or queued is `interrupted` ("server restarted while the job was active") and resumable,
its models reloaded from its completed load/unload steps; tombstones are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lemonade.errors import APIError
from lemonade.jobs.expr import ExprError, eval_condition, resolve_path, resolve_refs
from lemonade.jobs.records import (
    ACTIVE,
    ON_FAIL_ABORT,
    ON_FAIL_CONTINUE,
    RESTING,
    TERMINAL,
    GraphError,
    Job,
    now_iso,
    parse_definition,
)
from lemonade.runtime.exclusive import ExclusiveGate
from lemonade.runtime.request_context import ClientGone, Departure, client_gone
from lemonade.util.atomic import atomic_write_json, read_json

log = logging.getLogger("lemonade.jobs")
STATE_FILE = "jobs.json"
MAX_JOBS = 50
INTERRUPT_GRACE_SECONDS = 3.0  # an op that ignores the interrupt signal this long is cancelled outright


@dataclass
class Owned:
    """A model residency the job created with its own `load` step. `instance` is the router's
    LoadedModel while resident; None once an interrupt unloaded it (then `params` reload it)."""

    params: dict[str, Any]
    instance: Any = None
    pinned: bool | None = None


@dataclass
class RunState:
    """What a job holds on the model side, in memory (rebuilt from its steps after a restart)."""

    owned: dict[str, Owned] = field(default_factory=dict)
    snapshot: dict[str, bool] | None = None  # models resident (and their pins) when it first took the gate
    pending_loads: dict[str, Any] = field(default_factory=dict)  # interrupted loads: name -> instance before
    cancel: Departure = field(default_factory=Departure)


@dataclass
class Op:
    run: Callable[[dict[str, Any], RunState], Awaitable[Any]]
    exclusive: bool = False  # touches models: the job holds the router's gate


class ModelSide(Protocol):
    """What the engine needs from the server for exclusive jobs (api/lemonade/job_ops.py)."""

    @property
    def gate(self) -> ExclusiveGate: ...

    def ops(self) -> dict[str, Op]: ...
    def drained(self) -> bool: ...
    def resident_pins(self) -> dict[str, bool]: ...
    def canonical(self, name: str) -> str | None: ...
    async def reconcile(self, state: RunState) -> None: ...
    async def restore(self, state: RunState, manifest: dict[str, dict[str, Any]]) -> None: ...


@dataclass
class Control:
    pause: bool = False
    interrupt: bool = False
    delete: bool = False
    step_task: asyncio.Task[Any] | None = None


class JobManager:
    def __init__(self, config_dir: Path, side: ModelSide) -> None:
        self.path = Path(config_dir) / STATE_FILE
        self.side = side
        self.ops = side.ops()
        self.jobs: dict[str, Job] = {}  # oldest first
        self.controls: dict[str, Control] = {}
        self.states: dict[str, RunState] = {}
        self.queue: deque[str] = deque()
        self.active: str | None = None
        self._counter = 0
        self._wake: asyncio.Event | None = None
        self._changed: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self._closing = False  # shutdown: the router stops every engine anyway, no per-job cleanup
        self._restore()

    # ----- persistence --------------------------------------------------------------------------
    def _restore(self) -> None:
        try:
            data = read_json(self.path, {"jobs": []})
        except (OSError, ValueError) as exc:
            aside = self.path.with_suffix(".json.corrupt")
            log.error("Cannot read %s (%s); it is kept as %s and jobs start empty", self.path, exc, aside)
            with contextlib.suppress(OSError):
                self.path.replace(aside)
            return
        dropped = recovered = 0
        for raw in data.get("jobs", []) if isinstance(data, dict) else []:
            try:
                job = Job.from_json(raw)
            except (KeyError, TypeError, ValueError) as exc:
                log.error("Skipping an unreadable job in %s: %s", self.path, exc)
                continue
            suffix = job.id.rsplit("-", 1)[-1]
            if suffix.isdigit():  # tombstones count too: no id is ever given twice
                self._counter = max(self._counter, int(suffix))
            if job.deleted:
                dropped += 1
                continue
            if job.status in ACTIVE:
                recovered += 1
                job.status = "interrupted"
                job.error = "server restarted while the job was active"
                step = job.step(job.cursor)
                if step is not None and step.status == "running":
                    step.status = "pending"
                log.warning("Job %s ('%s') was active when the server stopped: now interrupted, resumable at "
                            "step '%s'", job.id, job.name, job.cursor)
            self.jobs[job.id] = job
            self.controls[job.id] = Control()
        if self.jobs or dropped:
            log.info("Restored %d job(s) from %s (%d recovered as interrupted, %d deleted ones dropped)",
                     len(self.jobs), self.path, recovered, dropped)
        if dropped or recovered:
            self._persist()

    def _persist(self) -> None:
        try:
            atomic_write_json(self.path, {"version": 1, "jobs": [j.to_json() for j in self.jobs.values()]})
        except OSError as exc:
            log.error("Cannot save jobs to %s: %s (the previous state stays on disk)", self.path, exc)
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    # ----- lifecycle of the worker ----------------------------------------------------------------
    def start(self) -> None:
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._worker = asyncio.create_task(self._work())

    async def aclose(self) -> None:
        """Server shutdown: the running job stops where it is (persisted as interrupted)."""
        if self._worker is None:
            return
        self._closing = True
        if self.active is not None:
            ctrl = self.controls[self.active]
            ctrl.interrupt = True
            job = self.jobs.get(self.active)
            if job is not None:
                job.status = "interrupted"
                job.error = "server stopped while the job was active"
                step = job.step(job.cursor)
                if step is not None and step.status == "running":
                    step.status = "pending"
                self._persist()
        self._worker.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._worker

    def _notify(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # ----- API operations -------------------------------------------------------------------------
    def _visible(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None or job.deleted:
            raise APIError(404, f"Job {job_id!r} was not found (GET /v1/jobs lists the jobs)", type="not_found",
                           code="job_not_found")
        return job

    def create(self, body: Any) -> str:
        try:
            name, steps, inputs = parse_definition(body, set(self.ops))
        except GraphError as exc:
            raise APIError(400, f"Invalid job: {exc}", code="invalid_job", plain=True) from None
        live = [j for j in self.jobs.values() if not j.deleted]
        while len(live) >= MAX_JOBS:
            oldest_done = next((j for j in live if j.status in TERMINAL), None)
            if oldest_done is None:
                raise APIError(429, f"The job store is full (job limit: {MAX_JOBS}): every kept job is still "
                               "active or resumable. Delete one (DELETE /v1/jobs/{id}) or let one finish first.",
                               code="too_many_jobs", plain=True)
            self._forget(oldest_done.id)
            live.remove(oldest_done)
        self._counter += 1
        job_id = f"job-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{self._counter:06d}"
        job = Job(id=job_id, name=name, steps=steps, inputs=inputs, context={"inputs": inputs}, cursor=steps[0].id)
        self.jobs[job_id] = job
        self.controls[job_id] = Control()
        self.queue.append(job_id)
        self._persist()
        self._notify()
        log.info("Created job %s '%s' (%d steps)", job_id, name, len(steps))
        return job_id

    def list(self) -> list[dict[str, Any]]:
        return [j.summary() for j in reversed(self.jobs.values()) if not j.deleted]  # newest first

    def get(self, job_id: str) -> dict[str, Any]:
        return self._visible(job_id).to_json()

    def _conflict(self, job: Job, action: str, allowed: str) -> APIError:
        return APIError(409, f"Job {job.id} is {job.status}; only {allowed} jobs can be {action}",
                        type="conflict", code="invalid_job_state")

    def pause(self, job_id: str) -> dict[str, Any]:
        job = self._visible(job_id)
        if job.status == "queued":
            self._dequeue(job_id)
            job.status = "paused"
            self._persist()
            log.info("Paused queued job %s", job_id)
            return {"status": "paused", "job": job.summary()}
        if job.status != "running":
            raise self._conflict(job, "paused", "queued or running")
        self.controls[job_id].pause = True
        log.info("Pause requested for job %s (takes effect after step '%s')", job_id, job.cursor)
        return {"status": "pausing", "job": job.summary()}

    def interrupt(self, job_id: str) -> dict[str, Any]:
        job = self._visible(job_id)
        if job.status == "queued":
            self._dequeue(job_id)
            job.status = "interrupted"
            self._persist()
            log.info("Interrupted queued job %s", job_id)
            return {"status": "interrupted", "job": job.summary()}
        if job.status != "running":
            raise self._conflict(job, "interrupted", "queued or running")
        self._signal_interrupt(job_id)
        log.info("Interrupt requested for job %s (step '%s' is cancelled)", job_id, job.cursor)
        return {"status": "interrupting", "job": job.summary()}

    def resume(self, job_id: str) -> dict[str, Any]:
        job = self._visible(job_id)
        if job.status not in RESTING:
            raise self._conflict(job, "resumed", "paused or interrupted")
        self.controls[job_id] = Control()
        job.status = "queued"
        job.error = ""
        self.queue.append(job_id)
        self._persist()
        self._notify()
        log.info("Resumed job %s at step '%s'", job_id, job.cursor)
        return {"status": "resuming", "job": job.summary()}

    def delete(self, job_id: str) -> dict[str, Any]:
        job = self._visible(job_id)
        ctrl = self.controls[job_id]
        state = self.states.get(job_id)
        if job_id == self.active or (state is not None and (state.owned or state.pending_loads)):
            # Tombstone first (durable), then let the worker clean up the models the job holds.
            job.deleted = True
            ctrl.delete = True
            self._persist()
            if job_id == self.active:
                self._signal_interrupt(job_id)
            else:
                self._dequeue(job_id)
                self.queue.append(job_id)
                self._notify()
            log.info("Deleting job %s: tombstoned; removed once its models are cleaned up", job_id)
        else:
            self._forget(job_id)
            self._persist()
            log.info("Deleted job %s", job_id)
        return {"status": "deleted", "id": job_id}

    def _signal_interrupt(self, job_id: str) -> None:
        ctrl = self.controls[job_id]
        ctrl.interrupt = True
        state = self.states.get(job_id)
        if state is not None:
            state.cancel.set()  # what a departing client does: queue waits end, engine requests are cancelled
        task = ctrl.step_task
        if task is not None and not task.done():
            asyncio.get_running_loop().call_later(INTERRUPT_GRACE_SECONDS,
                                                  lambda: None if task.done() else task.cancel())

    def _dequeue(self, job_id: str) -> None:
        with contextlib.suppress(ValueError):
            self.queue.remove(job_id)

    def _forget(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)
        self.controls.pop(job_id, None)
        self.states.pop(job_id, None)
        self._dequeue(job_id)

    async def events(self, job_id: str) -> AsyncIterator[dict[str, Any]]:
        """The job's state on every change (progress events), until it stops being active."""
        self._visible(job_id)
        last = None
        while True:
            changed = self._changed
            job = self.jobs.get(job_id)
            if job is None or job.deleted:
                yield {"id": job_id, "status": "deleted"}
                return
            snap = {**job.summary(), "steps": [{"id": s.id, "status": s.status, "duration_ms": s.duration_ms,
                                                **({"error": s.error} if s.error else {})} for s in job.steps]}
            if snap != last:
                last = snap
                yield snap
            if job.status not in ACTIVE or changed is None:
                return
            await changed.wait()

    # ----- the worker ---------------------------------------------------------------------------
    async def _work(self) -> None:
        assert self._wake is not None
        while True:
            while not self.queue:
                self._wake.clear()
                await self._wake.wait()
            job_id = self.queue.popleft()
            job = self.jobs.get(job_id)
            if job is None:
                continue
            if job.deleted:
                await self._cleanup_deleted(job_id)
                continue
            if job.status != "queued":
                continue
            job.status = "running"
            job.started_at = job.started_at or now_iso()
            self.active = job_id
            self._persist()
            log.info("Running job %s '%s' from step '%s'", job_id, job.name, job.cursor)
            try:
                await asyncio.create_task(self._run(job))  # a task of its own: its own context (gate holder)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("Job %s stopped on an unexpected error", job_id)
                job.status, job.error, job.finished_at = "failed", "internal error (see the server log)", now_iso()
                self._persist()
            finally:
                self.active = None
            if self.controls.get(job_id, Control()).delete:
                self._forget(job_id)
                self._persist()
                log.info("Deleted job %s after cleaning up its models", job_id)

    async def _cleanup_deleted(self, job_id: str) -> None:
        state = self.states.get(job_id)
        if state is not None:
            try:
                await self.side.reconcile(state)
            except Exception:
                log.exception("Cleaning up the models of deleted job %s failed", job_id)
        self._forget(job_id)
        self._persist()
        log.info("Deleted job %s after cleaning up its models", job_id)

    def _manifest(self, job: Job) -> dict[str, dict[str, Any]]:
        """What the completed load/unload steps say should be resident (for a resume after a restart)."""
        manifest: dict[str, dict[str, Any]] = {}
        for step in job.steps:
            if step.status != "completed" or step.op not in ("load", "unload"):
                continue
            try:
                params = resolve_refs(step.params, job.context)
            except ExprError:
                continue
            name = params.get("model_name", params.get("model"))
            canonical = self.side.canonical(name) if isinstance(name, str) else None
            if step.op == "load" and canonical:
                manifest[canonical] = params
            elif step.op == "unload":
                if canonical:
                    manifest.pop(canonical, None)
                elif name is None:
                    manifest.clear()
        return manifest

    async def _run(self, job: Job) -> None:
        ctrl = self.controls[job.id]
        exclusive = any(self.ops[s.op].exclusive for s in job.steps)
        state = self.states.setdefault(job.id, RunState())
        state.cancel = Departure()
        if ctrl.interrupt:
            state.cancel.set()
        client_gone.set(state.cancel)  # the router and the proxy watch it as they watch a client's departure
        holder = object()
        held = False
        try:
            if exclusive:
                await self.side.gate.close(holder, self.side.drained)
                held = True
                if state.snapshot is None:
                    state.snapshot = self.side.resident_pins()
                await self.side.restore(state, self._manifest(job))
            await self._execute(job, ctrl, state)
        except ClientGone:
            job.status = "interrupted"
            log.info("Job %s was interrupted while waiting for the model slot", job.id)
            self._persist()
        finally:
            if exclusive and (job.status == "interrupted" or ctrl.delete) and not self._closing:
                try:
                    await self.side.reconcile(state)
                    log.info("Job %s: the models it loaded were unloaded (they are reloaded on resume)", job.id)
                except Exception:
                    log.exception("Job %s: unloading its models failed", job.id)
            if job.status in TERMINAL:
                self.states.pop(job.id, None)  # a finished job commits its model side-effects
            if held:
                self.side.gate.open(holder)

    def _fail(self, job: Job, message: str) -> None:
        job.status, job.error, job.finished_at = "failed", message, now_iso()
        self._persist()
        log.error("Job %s failed: %s", job.id, message)

    async def _execute(self, job: Job, ctrl: Control, state: RunState) -> None:
        while True:
            if ctrl.interrupt:
                step = job.step(job.cursor)
                if step is not None:
                    step.status = "pending"
                job.status = "interrupted"
                self._persist()
                log.info("Job %s interrupted at step '%s'", job.id, job.cursor)
                return
            if ctrl.pause:
                job.status = "paused"
                self._persist()
                log.info("Job %s paused before step '%s'", job.id, job.cursor)
                return
            if not job.cursor:
                for s in job.steps:
                    if s.status == "pending":
                        s.status = "skipped"  # not on the path taken
                job.status, job.finished_at = "completed", now_iso()
                self._persist()
                log.info("Job %s completed (%d steps)", job.id, len(job.steps))
                return
            step = job.step(job.cursor)
            if step is None:
                return self._fail(job, f"the cursor names an unknown step '{job.cursor}'")
            try:
                run = eval_condition(step.when, job.context)
                params = resolve_refs(step.params, job.context) if run else {}
            except ExprError as exc:
                step.status, step.error = "failed", str(exc)
                return self._fail(job, f"step '{step.id}': {exc}")
            if not run:
                step.status = "skipped"
                job.cursor = job.next_in_list(step.id)
                self._persist()
                continue
            step.status, step.error = "running", ""
            self._persist()
            done_before = job.progress()["completed"]
            log.info("Job %s: step '%s' (%s) running (%d/%d done)", job.id, step.id, step.op, done_before,
                     len(job.steps))
            ok, output, error, seconds = await self._run_op(step.op, params, ctrl, state)
            step.duration_ms = int(round(seconds * 1000))
            if ctrl.interrupt:
                step.status, step.error = "pending", ""  # an interrupted step never took effect
                continue
            if ok:
                try:
                    extracted = {key: resolve_path(path, output) for key, path in step.extract.items()}
                    job.context[step.id] = output
                    job.context.update(extracted)
                    nxt = next((c["goto"] for c in step.branch if eval_condition(c["when"], job.context)), None)
                except ExprError as exc:
                    step.status, step.error = "failed", str(exc)
                    return self._fail(job, f"step '{step.id}': {exc}")
                step.status, step.output = "completed", output
                job.cursor = nxt or step.on_done or job.next_in_list(step.id)
                log.info("Job %s: step '%s' completed in %d ms -> %s", job.id, step.id, step.duration_ms,
                         f"'{job.cursor}'" if job.cursor else "end")
            else:
                step.status, step.error = "failed", error
                if step.on_fail == ON_FAIL_ABORT:
                    return self._fail(job, f"step '{step.id}' ({step.op}) failed: {error}")
                step.failure_handled = True
                job.cursor = job.next_in_list(step.id) if step.on_fail == ON_FAIL_CONTINUE else step.on_fail
                log.warning("Job %s: step '%s' failed (%s); on_fail goes on to %s", job.id, step.id, error,
                            f"'{job.cursor}'" if job.cursor else "the end")
            self._persist()

    async def _run_op(self, op_name: str, params: dict[str, Any], ctrl: Control,
                      state: RunState) -> tuple[bool, Any, str, float]:
        """(ok, output, error, seconds) of one op; an interrupt shows as ctrl.interrupt, not as an error."""
        started = time.perf_counter()
        task = asyncio.ensure_future(self.ops[op_name].run(params, state))
        ctrl.step_task = task
        ok, output, error = False, None, ""
        try:
            ok, output = True, await task
        except (ClientGone, asyncio.CancelledError):
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the job's own task is cancelled (shutdown): not an op outcome
            error = "interrupted" if ctrl.interrupt else "the operation was cancelled"
        except APIError as exc:
            error = exc.message
        except Exception as exc:  # an op's unexpected failure is the step's failure, not the server's
            log.exception("Op %s failed", op_name)
            error = f"{type(exc).__name__}: {exc}"
        finally:
            ctrl.step_task = None
        return ok, output, error, time.perf_counter() - started
