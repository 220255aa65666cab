"""Job and step records: what a job is, how it is written to `jobs.json`, and the checks a posted
step graph must pass (upstream `docs/dev/job-system.md`).

A step graph is validated once, when the job is created, so that running it cannot loop or jump
to nowhere: every `branch[].goto`, `on_done` and `on_fail` target names a *later* step, and every
condition parses. Errors name the step (index and id) and the field, for a 400.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from lemonade.jobs.expr import ExprError, check_refs, parse

JOB_STATES = ("queued", "running", "paused", "interrupted", "completed", "failed")
ACTIVE = ("queued", "running")
RESTING = ("paused", "interrupted")  # resumable
TERMINAL = ("completed", "failed")
STEP_FIELDS = ("id", "op", "params", "when", "extract", "branch", "on_done", "on_fail")
ON_FAIL_ABORT, ON_FAIL_CONTINUE = "abort", "continue"


class GraphError(ValueError):
    """A posted job that cannot run; the message names the step and field (a 400)."""


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Step:
    id: str
    op: str
    params: dict[str, Any] = field(default_factory=dict)
    when: str = ""
    extract: dict[str, str] = field(default_factory=dict)
    branch: list[dict[str, str]] = field(default_factory=list)
    on_done: str = ""
    on_fail: str = ON_FAIL_ABORT
    # run state
    status: str = "pending"  # pending, running, completed, failed, skipped
    failure_handled: bool = False  # failed, but on_fail continued or jumped: counts as done
    duration_ms: int = 0
    error: str = ""
    output: Any = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "op": self.op, "params": self.params, "status": self.status,
                               "duration_ms": self.duration_ms}
        for key in ("when", "extract", "branch", "on_done"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.on_fail != ON_FAIL_ABORT:
            out["on_fail"] = self.on_fail
        if self.failure_handled:
            out["failure_handled"] = True
        if self.error:
            out["error"] = self.error
        if self.output is not None:
            out["output"] = self.output
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Step:
        return cls(id=d["id"], op=d["op"], params=d.get("params") or {}, when=d.get("when") or "",
                   extract=d.get("extract") or {}, branch=d.get("branch") or [], on_done=d.get("on_done") or "",
                   on_fail=d.get("on_fail") or ON_FAIL_ABORT, status=d.get("status", "pending"),
                   failure_handled=bool(d.get("failure_handled")), duration_ms=int(d.get("duration_ms", 0)),
                   error=d.get("error", ""), output=d.get("output"))

    @property
    def done(self) -> bool:
        """Needs no more work (what `progress.completed` counts)."""
        return self.status in ("completed", "skipped") or (self.status == "failed" and self.failure_handled)


@dataclass
class Job:
    id: str
    name: str
    steps: list[Step]
    inputs: dict[str, Any] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)
    status: str = "queued"
    cursor: str = ""  # the current or next step; "" once past the last
    created_at: str = field(default_factory=now_iso)
    started_at: str = ""
    finished_at: str = ""
    error: str = ""
    deleted: bool = False  # tombstone: deleted while it still had cleanup to do

    def step(self, step_id: str) -> Step | None:
        return next((s for s in self.steps if s.id == step_id), None)

    def index(self, step_id: str) -> int:
        return next((i for i, s in enumerate(self.steps) if s.id == step_id), -1)

    def next_in_list(self, step_id: str) -> str:
        i = self.index(step_id)
        return self.steps[i + 1].id if 0 <= i < len(self.steps) - 1 else ""

    def progress(self) -> dict[str, Any]:
        return {"cursor": self.cursor, "completed": sum(1 for s in self.steps if s.done),
                "step_count": len(self.steps)}

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "name": self.name, "status": self.status,
                               "created_at": self.created_at, "progress": self.progress()}
        for key in ("started_at", "finished_at", "error"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out

    def to_json(self) -> dict[str, Any]:
        out = {**self.summary(), "inputs": self.inputs, "context": self.context, "cursor": self.cursor,
               "steps": [s.to_json() for s in self.steps]}
        if self.deleted:
            out["deleted"] = True
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Job:
        return cls(id=d["id"], name=d.get("name", ""), steps=[Step.from_json(s) for s in d.get("steps", [])],
                   inputs=d.get("inputs") or {}, context=d.get("context") or {}, status=d.get("status", "failed"),
                   cursor=d.get("cursor", ""), created_at=d.get("created_at", ""), started_at=d.get("started_at", ""),
                   finished_at=d.get("finished_at", ""), error=d.get("error", ""), deleted=bool(d.get("deleted")))


# ----- validation of a posted definition ---------------------------------------------------------

def _where(i: int, raw: Any) -> str:
    sid = raw.get("id") if isinstance(raw, dict) else None
    return f"steps[{i}]" + (f" ('{sid}')" if isinstance(sid, str) and sid else "")


def _string(value: Any, where: str, name: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise GraphError(f"{where}.{name} must be a string, got {type(value).__name__}")
    return value


def _condition(text: str, where: str) -> None:
    try:
        parse(text)
    except ExprError as exc:
        raise GraphError(f"{where}: invalid expression {text!r}: {exc}") from None


def parse_steps(raw_steps: Any, known_ops: set[str]) -> list[Step]:
    """The posted steps as records, or GraphError naming the first bad step and field."""
    if not isinstance(raw_steps, list) or not raw_steps:
        raise GraphError("'steps' must be a non-empty array of steps (or 'definition': {'steps': [...]})")
    steps: list[Step] = []
    index: dict[str, int] = {}
    for i, raw in enumerate(raw_steps):
        where = _where(i, raw)
        if not isinstance(raw, dict):
            raise GraphError(f"{where} must be an object with 'id' and 'op'")
        unknown = sorted(set(raw) - set(STEP_FIELDS))
        if unknown:
            raise GraphError(f"{where} has unknown field(s) {', '.join(repr(u) for u in unknown)}; a step has "
                             + ", ".join(STEP_FIELDS))
        sid = raw.get("id")
        if not isinstance(sid, str) or not sid:
            raise GraphError(f"{where}.id must be a non-empty string")
        if sid == "inputs":
            raise GraphError(f"{where}.id: 'inputs' is reserved (the job's inputs are context.inputs)")
        if "." in sid or "${" in sid or "}" in sid:
            raise GraphError(f"{where}.id: '{sid}' must not contain '.', '${{' or '}}' (ids are reference paths)")
        if sid in index:
            raise GraphError(f"{where}.id: duplicate step id '{sid}' (also steps[{index[sid]}])")
        index[sid] = i
        op = raw.get("op")
        if not isinstance(op, str) or op not in known_ops:
            raise GraphError(f"{where}.op: unknown op {op!r}; known ops: {', '.join(sorted(known_ops))}")
        params = raw.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise GraphError(f"{where}.params must be an object")
        try:
            check_refs(params)
        except ExprError as exc:
            raise GraphError(f"{where}.params: {exc}") from None
        when = _string(raw.get("when"), where, "when")
        _condition(when, f"{where}.when")
        extract = raw.get("extract") or {}
        if not isinstance(extract, dict) or not all(isinstance(v, str) and v for v in extract.values()):
            raise GraphError(f"{where}.extract must map context keys to output paths (non-empty strings)")
        for key in extract:
            if not key or "." in key or key == "inputs":
                raise GraphError(f"{where}.extract: key {key!r} must be non-empty, without '.', and not 'inputs'")
        branch = raw.get("branch") or []
        if not isinstance(branch, list):
            raise GraphError(f"{where}.branch must be an array of {{'when', 'goto'}} cases")
        cases = []
        for j, case in enumerate(branch):
            if not isinstance(case, dict) or set(case) - {"when", "goto"}:
                raise GraphError(f"{where}.branch[{j}] must be an object with 'when' and 'goto' only")
            goto = _string(case.get("goto"), f"{where}.branch[{j}]", "goto")
            if not goto:
                raise GraphError(f"{where}.branch[{j}].goto is required (the id of a later step)")
            cond = _string(case.get("when"), f"{where}.branch[{j}]", "when")
            _condition(cond, f"{where}.branch[{j}].when")
            cases.append({"when": cond, "goto": goto})
        steps.append(Step(id=sid, op=op, params=params, when=when, extract=dict(extract), branch=cases,
                          on_done=_string(raw.get("on_done"), where, "on_done"),
                          on_fail=_string(raw.get("on_fail"), where, "on_fail") or ON_FAIL_ABORT))
    # Forward-only control flow: every target is a later step, so a run always terminates.
    for extract_key in (k for s in steps for k in s.extract):
        if extract_key in index:
            raise GraphError(f"extract key '{extract_key}' is also a step id; the step's output would be overwritten")
    for i, step in enumerate(steps):
        where = f"steps[{i}] ('{step.id}')"
        targets = [(f"{where}.branch[{j}].goto", c["goto"]) for j, c in enumerate(step.branch)]
        if step.on_done:
            targets.append((f"{where}.on_done", step.on_done))
        if step.on_fail not in (ON_FAIL_ABORT, ON_FAIL_CONTINUE):
            targets.append((f"{where}.on_fail", step.on_fail))
        for name, target in targets:
            if target not in index:
                extra = " (or 'abort' / 'continue')" if name.endswith("on_fail") else ""
                raise GraphError(f"{name}: '{target}' is not a step id of this job{extra}")
            if index[target] <= i:
                raise GraphError(f"{name}: '{target}' is not a later step (jumps go forward only: no loops)")
    return steps


def parse_definition(body: Any, known_ops: set[str]) -> tuple[str, list[Step], dict[str, Any]]:
    """`{name, definition: {steps} | steps, inputs}` -> (name, steps, inputs)."""
    if not isinstance(body, dict):
        raise GraphError("the body must be a JSON object {name, steps | definition: {steps}, inputs}")
    name = body.get("name", "")
    if not isinstance(name, str):
        raise GraphError("'name' must be a string")
    definition = body.get("definition")
    if definition is not None:
        if not isinstance(definition, dict) or "steps" not in definition:
            raise GraphError("'definition' must be an object with 'steps'")
        raw_steps = definition["steps"]
    elif "steps" in body:
        raw_steps = body["steps"]
    else:
        raise GraphError("missing 'steps' (or 'definition': {'steps': [...]})")
    inputs = body.get("inputs")
    if inputs is None:
        inputs = {}
    if not isinstance(inputs, dict):
        raise GraphError("'inputs' must be an object")
    return name, parse_steps(raw_steps, known_ops), inputs
