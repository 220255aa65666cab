"""`POST /internal/shutdown` (guide-configuration-README.md: shutdown is one of the internal control
endpoints; Lemonade's server has the route): the admin key only where one is set, engines stopped
before the answer, the running job recorded as interrupted, and the process exits with status 0.
Against the real server with Gemma 3 270M on llama-server."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import psutil

from tests.helpers import GEMMA_NAME, ServerFactory, wait_for

ADMIN, USER = {"Authorization": "Bearer admin-key"}, {"Authorization": "Bearer user-key"}


def test_shutdown_is_the_admins_and_stops_everything_cleanly(make_server: ServerFactory, gemma_dir: Path):
    env = {"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir), "LEMONADE_API_KEY": "user-key",
           "LEMONADE_ADMIN_API_KEY": "admin-key"}
    server = make_server(env=env)
    with server.client() as c:
        assert c.post("/v1/load", json={"model_name": GEMMA_NAME, "pinned": True}, headers=USER).status_code == 200
        [engine] = c.get("/v1/health", headers=USER).json()["all_models_loaded"]
        job = c.post("/v1/jobs", headers=USER, json={"steps": [{"id": "nap", "op": "sleep", "params": {"ms": 600000}}]})
        job_id = job.json()["id"]
        wait_for(lambda: c.get(f"/v1/jobs/{job_id}", headers=USER).json()["status"] == "running")

        for headers in ({}, USER):  # the API key is not enough: /internal/* is the admin's
            refused = c.post("/internal/shutdown", headers=headers)
            assert refused.status_code == 401, refused.text
        assert server.proc.poll() is None and psutil.pid_exists(engine["pid"])

        answer = c.post("/internal/shutdown", headers=ADMIN)
        assert answer.status_code == 200 and answer.json() == {"status": "shutting down"}
        assert not psutil.pid_exists(engine["pid"])  # stopped before the answer, not after
    assert server.proc.wait(30) == 0
    assert "Shutdown requested (POST /internal/shutdown)" in server.log()
    stored = {j["id"]: j for j in json.loads((server.config_dir / "jobs.json").read_text())["jobs"]}
    assert stored[job_id]["status"] == "interrupted", stored[job_id]  # resumable at the next start

    again = make_server(env=env, cache=server.cache)  # the same dirs: nothing was lost
    with again.client() as c:
        resumed = c.post(f"/v1/jobs/{job_id}/resume", headers=USER)
        assert resumed.status_code == 200, resumed.text
        assert c.post("/internal/shutdown", headers=ADMIN).status_code == 200
    assert again.proc.wait(30) == 0


def test_without_keys_anyone_on_loopback_may_stop_it(make_server: ServerFactory):
    """No key set, as in the guide's table: internal endpoints need no auth (the server listens on
    loopback by default)."""
    server = make_server()
    assert httpx.post(server.url + "/internal/shutdown", timeout=30).json() == {"status": "shutting down"}
    assert server.proc.wait(30) == 0
