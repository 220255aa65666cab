"""The Job Engine (`/v1/jobs`, upstream docs/dev/job-system.md) on the real server with the real
Gemma 3 270M: jobs that load and chat and pass data forward, branching, the exclusive slot (other
traffic, sent with the official `openai` client, waits behind a running job), pause / interrupt /
resume, delete of a running job, progress events, invalid step graphs, and a job that survives the
server being killed and started again on the same cache dir.
"""

from __future__ import annotations

import json
import signal
import threading
from typing import Any

import httpx
import openai
import pytest

from tests.helpers import GEMMA_ID, GEMMA_NAME, Server, wait_for

PROMPT = "The capital of France is"


def chat_params(content: str, max_tokens: int = 6, **extra: Any) -> dict[str, Any]:
    return {"model": GEMMA_NAME, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, **extra}


def job(c: httpx.Client, job_id: str) -> dict[str, Any]:
    r = c.get(f"/v1/jobs/{job_id}")
    assert r.status_code == 200, r.text
    return r.json()


def wait_status(c: httpx.Client, job_id: str, *states: str, timeout: float = 120.0) -> dict[str, Any]:
    return wait_for(lambda: (j := job(c, job_id))["status"] in states and j, timeout)


def wait_step_running(c: httpx.Client, job_id: str, step_id: str) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        j = job(c, job_id)
        assert j["status"] in ("queued", "running"), j
        step = next(s for s in j["steps"] if s["id"] == step_id)
        return j if j["cursor"] == step_id and step["status"] == "running" else None
    return wait_for(running)


def create(c: httpx.Client, body: dict[str, Any]) -> str:
    r = c.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def loaded(c: httpx.Client) -> set[str]:
    return {m["model_name"] for m in c.get("/v1/health").json()["all_models_loaded"]}


def statuses(j: dict[str, Any]) -> dict[str, str]:
    return {s["id"]: s["status"] for s in j["steps"]}


@pytest.fixture(scope="module")
def c(gemma_server: Server):
    with gemma_server.client() as client:
        yield client


def test_invalid_jobs_are_refused_with_the_step_and_field(c):
    cases = [
        ({"steps": [{"id": "a", "op": "sleep"}, {"id": "b", "op": "sleep", "on_done": "a"}]},
         "steps[1] ('b').on_done: 'a' is not a later step"),
        ({"steps": [{"id": "a", "op": "teleport"}]}, "steps[0] ('a').op: unknown op 'teleport'"),
        ({"steps": [{"id": "a", "op": "chat", "when": "${x} > 1 > 0"}]}, "steps[0] ('a').when: invalid expression"),
        ({"steps": [{"id": "a", "op": "sleep", "branch": [{"when": "true", "goto": "nowhere"}]}]},
         "steps[0] ('a').branch[0].goto: 'nowhere'"),
        ({"name": "x"}, "missing 'steps'"),
    ]
    for body, message in cases:
        r = c.post("/v1/jobs", json=body)
        assert r.status_code == 400, r.text
        assert message in r.json()["error"], (message, r.text)  # a plain string, as Lemonade's clients read it
    r = c.post("/v1/jobs", json=[1, 2])
    assert r.status_code == 400 and "JSON object" in r.json()["message"], r.text
    for method, path in [("GET", ""), ("DELETE", ""), ("POST", "/pause"), ("POST", "/interrupt"),
                         ("POST", "/resume"), ("GET", "/events")]:
        r = c.request(method, f"/v1/jobs/job-unknown{path}")
        assert r.status_code == 404 and "job-unknown" in r.json()["error"]["message"], (method, path, r.text)


def test_the_job_store_holds_50_and_queued_jobs_pause_at_once(c):
    """Fifty jobs that are active or resumable fill the store (429); a queued job pauses and
    interrupts at once; deleting one makes room; deleting the running one stops it."""
    ids = [create(c, {"name": f"wait{i}", "steps": [{"id": "nap", "op": "sleep", "params": {"ms": 600000}}]})
           for i in range(50)]
    try:
        r = c.post("/v1/jobs", json={"steps": [{"id": "a", "op": "sleep"}]})
        assert r.status_code == 429 and "job limit: 50" in r.json()["error"], r.text
        r = c.post(f"/v1/jobs/{ids[-1]}/pause")
        assert r.status_code == 200 and r.json()["status"] == "paused", r.text  # it was queued: paused now
        r = c.post(f"/v1/jobs/{ids[-2]}/interrupt")
        assert r.status_code == 200 and r.json()["status"] == "interrupted", r.text
        assert c.post(f"/v1/jobs/{ids[-1]}/pause").status_code == 409
        assert c.delete(f"/v1/jobs/{ids.pop()}").status_code == 200
        ids.append(create(c, {"steps": [{"id": "a", "op": "sleep"}]}))  # room again
    finally:
        for job_id in reversed(ids):  # queued ones first, so none starts running meanwhile
            assert c.delete(f"/v1/jobs/{job_id}").status_code == 200
    wait_for(lambda: not c.get("/v1/jobs").json()["jobs"] or None, timeout=30)


def test_chat_job_passes_data_forward_and_branches(c):
    """Load, chat, pass the answer forward into a second chat, branch over a step, skip a guarded
    one; progress events stream until the job completes."""
    body = {"name": "forward", "inputs": {"model": GEMMA_NAME, "prompt": PROMPT},
            "steps": [
                {"id": "load", "op": "load", "params": {"model": "${inputs.model}"}},
                {"id": "ask", "op": "chat", "params": chat_params("${inputs.prompt}"),
                 "extract": {"answer": "choices.0.message.content", "n": "usage.completion_tokens"},
                 "branch": [{"when": "${n} > 0 && ${ask.choices.0.finish_reason} != 'error'", "goto": "echo"}]},
                {"id": "never", "op": "sleep", "params": {"ms": 60000}},
                {"id": "echo", "op": "chat", "params": chat_params("Repeat after me: ${answer}", max_tokens=3),
                 "when": "${n} >= 1", "extract": {"echo_model": "model"}},
                {"id": "guarded", "op": "sleep", "params": {"ms": 1}, "when": "${inputs.prompt} == 'other'"},
                {"id": "info", "op": "models", "params": {"id": "${inputs.model}"},
                 "extract": {"downloaded": "downloaded"}},
            ]}
    job_id = create(c, body)
    events = []
    with c.stream("GET", f"/v1/jobs/{job_id}/events") as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
    assert events[-1]["status"] == "completed", events[-1]
    assert any(e["status"] == "running" and e["progress"]["cursor"] == "ask" for e in events), events

    j = job(c, job_id)
    assert j["status"] == "completed", j
    assert statuses(j) == {"load": "completed", "ask": "completed", "never": "skipped", "echo": "completed",
                           "guarded": "skipped", "info": "completed"}
    ctx = j["context"]
    ask = ctx["ask"]  # the engine's answer verbatim
    assert ask["usage"]["completion_tokens"] == ctx["n"] >= 1 and "timings" in ask
    assert isinstance(ctx["answer"], str) and ctx["answer"] == ask["choices"][0]["message"]["content"]
    assert ctx["echo"]["choices"][0]["message"]["content"] is not None
    assert ctx["downloaded"] is True and ctx["inputs"] == body["inputs"]
    assert j["steps"][0]["output"]["loaded"] is True and j["steps"][0]["output"]["backend"] == "cpu"
    summary = next(s for s in c.get("/v1/jobs").json()["jobs"] if s["id"] == job_id)
    assert summary["progress"] == {"cursor": "", "completed": 6, "step_count": 6}
    r = c.post(f"/v1/jobs/{job_id}/resume")
    assert r.status_code == 409 and "completed" in r.json()["error"]["message"], r.text


def test_failure_branches_and_aborts(c):
    """on_fail as a branch (a load of a model that does not exist jumps to a recovery step), and
    an abort that fails the job naming the step."""
    recover = create(c, {"steps": [
        {"id": "bad_load", "op": "load", "params": {"model": "no-such-model"}, "on_fail": "fallback"},
        {"id": "skipped", "op": "sleep", "params": {"ms": 1}},
        {"id": "fallback", "op": "system_stats"}]})
    j = wait_status(c, recover, "completed", "failed")
    assert j["status"] == "completed" and statuses(j) == {"bad_load": "failed", "skipped": "skipped",
                                                          "fallback": "completed"}, j
    assert "no-such-model" in j["steps"][0]["error"] and j["progress"]["completed"] == 3
    abort = create(c, {"steps": [{"id": "nap", "op": "sleep", "params": {"ms": "${inputs.missing}"}},
                                 {"id": "after", "op": "sleep"}]})
    j = wait_status(c, abort, "completed", "failed")
    assert j["status"] == "failed" and "nap" in j["error"] and "inputs.missing" in j["error"], j


def test_running_job_holds_the_slot_until_paused(c, gemma_server):
    """While a job with model steps runs, an ordinary chat (official openai client) waits; pausing
    the job releases the slot, keeps the model the job loaded, and resume finishes the job."""
    job_id = create(c, {"name": "hold", "steps": [
        {"id": "unload", "op": "unload"},
        {"id": "load", "op": "load", "params": {"model": GEMMA_NAME}},
        {"id": "nap", "op": "sleep", "params": {"ms": 2500}},
        {"id": "ask", "op": "chat", "params": chat_params(PROMPT)}]})
    wait_step_running(c, job_id, "nap")
    seen: dict[str, Any] = {}

    def outside_chat() -> None:
        client = openai.OpenAI(base_url=gemma_server.url + "/v1", api_key="unused", max_retries=0)
        answer = client.chat.completions.create(model=GEMMA_NAME, max_tokens=3,
                                                messages=[{"role": "user", "content": "Hi"}])
        seen["job_status_when_answered"] = job(c, job_id)["status"]
        seen["answer"] = answer

    thread = threading.Thread(target=outside_chat)
    thread.start()
    r = c.post(f"/v1/jobs/{job_id}/pause")
    assert r.status_code == 200 and r.json()["status"] == "pausing", r.text
    thread.join(120)
    assert seen["answer"].choices[0].message is not None
    assert seen["job_status_when_answered"] == "paused"  # answered only once the job let go of the slot
    j = job(c, job_id)
    # Paused after the step that was running when asked: the nap (or, on a slow machine, the chat after it).
    assert j["status"] == "paused" and statuses(j)["nap"] == "completed" and j["cursor"] in ("ask", ""), j
    assert GEMMA_NAME in loaded(c)  # a pause keeps the job's model
    assert c.post(f"/v1/jobs/{job_id}/pause").status_code == 409
    assert c.post(f"/v1/jobs/{job_id}/interrupt").status_code == 409
    r = c.post(f"/v1/jobs/{job_id}/resume")
    assert r.status_code == 200, r.text
    j = wait_status(c, job_id, "completed", "failed")
    assert j["status"] == "completed" and j["context"]["ask"]["choices"][0]["message"]["content"] is not None, j


def test_interrupt_unloads_the_jobs_model_and_resume_reloads_it(c, gemma_server):
    job_id = create(c, {"name": "interrupt", "steps": [
        {"id": "unload", "op": "unload"},
        {"id": "load", "op": "load", "params": {"model": GEMMA_NAME}},
        {"id": "nap", "op": "sleep", "params": {"ms": 4000}},
        {"id": "ask", "op": "chat", "params": chat_params(PROMPT)}]})
    wait_step_running(c, job_id, "nap")
    assert GEMMA_NAME in loaded(c)
    r = c.post(f"/v1/jobs/{job_id}/interrupt")
    assert r.status_code == 200 and r.json()["status"] == "interrupting", r.text
    j = wait_status(c, job_id, "interrupted")
    # The step running when asked goes back to pending: the nap (or, on a slow machine, the chat after it).
    assert j["cursor"] in ("nap", "ask") and statuses(j)[j["cursor"]] == "pending", j
    assert statuses(j)["ask"] == "pending" and statuses(j)["load"] == "completed", j
    wait_for(lambda: GEMMA_NAME not in loaded(c), timeout=30)  # the model the job loaded is unloaded
    r = c.post(f"/v1/jobs/{job_id}/resume")
    assert r.status_code == 200 and r.json()["status"] == "resuming", r.text
    j = wait_status(c, job_id, "completed", "failed")
    assert j["status"] == "completed" and "choices" in j["context"]["ask"], j
    assert GEMMA_NAME in loaded(c)
    # reloaded before the pending step ran again
    assert f"Reloaded {GEMMA_ID} for the resumed job" in gemma_server.log_path.read_text()


def test_delete_a_running_job_aborts_its_chat_and_cleans_up(c, gemma_server):
    job_id = create(c, {"name": "delete", "steps": [
        {"id": "unload", "op": "unload"},
        {"id": "load", "op": "load", "params": {"model": GEMMA_NAME}},
        {"id": "long", "op": "chat", "params": chat_params("Write a very long story.", max_tokens=4000,
                                                           ignore_eos=True)}]})
    wait_step_running(c, job_id, "long")
    r = c.delete(f"/v1/jobs/{job_id}")
    assert r.status_code == 200, r.text
    assert c.get(f"/v1/jobs/{job_id}").status_code == 404  # gone at once (tombstoned on disk)
    assert job_id not in {s["id"] for s in c.get("/v1/jobs").json()["jobs"]}
    wait_for(lambda: GEMMA_NAME not in loaded(c), timeout=60)  # the chat was aborted, the model unloaded
    stored = wait_for(lambda: (d := json.loads((gemma_server.config_dir / "jobs.json").read_text())) and
                      job_id not in {x["id"] for x in d["jobs"]} and d)
    assert stored["version"] == 1
    assert c.delete(f"/v1/jobs/{job_id}").status_code == 404


def test_job_survives_a_server_restart(make_server, gemma_dir):
    env = {"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)}
    srv = make_server(env=env)
    with srv.client() as c:
        job_id = create(c, {"name": "durable", "inputs": {"prompt": PROMPT}, "steps": [
            {"id": "load", "op": "load", "params": {"model": GEMMA_NAME}},
            {"id": "ask", "op": "chat", "params": chat_params("${inputs.prompt}"),
             "extract": {"answer": "choices.0.message.content"}},
            {"id": "nap", "op": "sleep", "params": {"ms": 4000}},
            {"id": "again", "op": "chat", "params": chat_params("${answer} and", max_tokens=3)}]})
        wait_step_running(c, job_id, "nap")
    srv.stop(signal.SIGKILL)  # by pid: a crash, no chance to write anything more
    state_file = srv.config_dir / "jobs.json"
    stored = json.loads(state_file.read_text())
    assert next(x for x in stored["jobs"] if x["id"] == job_id)["status"] == "running"
    # As if the crash came between a delete's answer and the job's removal: a tombstone on disk.
    stored["jobs"].append({**stored["jobs"][0], "id": "job-20260101-000000-000099", "deleted": True})
    state_file.write_text(json.dumps(stored))

    again = make_server(env=env, cache=srv.cache)
    with again.client() as c:
        j = job(c, job_id)
        assert j["status"] == "interrupted" and "restarted" in j["error"] and j["cursor"] == "nap", j
        assert statuses(j) == {"load": "completed", "ask": "completed", "nap": "pending", "again": "pending"}
        answer = j["context"]["answer"]
        assert isinstance(answer, str)
        assert c.post(f"/v1/jobs/{job_id}/resume").status_code == 200
        j = wait_status(c, job_id, "completed", "failed")
        assert j["status"] == "completed" and j["context"]["answer"] == answer, j
        assert "choices" in j["context"]["again"]
        assert GEMMA_NAME in loaded(c)
        assert c.get("/v1/jobs/job-20260101-000000-000099").status_code == 404  # the tombstone was dropped
        stopped = create(c, {"steps": [{"id": "nap", "op": "sleep", "params": {"ms": 600000}}]})
        assert int(stopped.rsplit("-", 1)[1]) > 99  # ids keep counting from the restored ones
        wait_step_running(c, stopped, "nap")
    assert f"Reloaded {GEMMA_ID} for the resumed job" in again.log_path.read_text()  # from its completed load step
    again.stop()  # SIGTERM: a clean stop records the running job as interrupted
    stored = {x["id"]: x for x in json.loads(state_file.read_text())["jobs"]}
    assert "job-20260101-000000-000099" not in stored
    assert stored[stopped]["status"] == "interrupted" and "stopped" in stored[stopped]["error"], stored[stopped]
    assert stored[job_id]["status"] == "completed"
