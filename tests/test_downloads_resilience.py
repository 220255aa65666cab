"""Downloads under stress: server-owned jobs, pause/resume, a killed server, corruption, concurrency,
offline mode, a full disk, and a model that is downloaded on first use and then really answers.

The big file is the real Gemma 3 270M GGUF (253 MB) served by the local hub; the hub throttles it
where a test needs a download to still be running. No test asserts a duration.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.helpers import error_of, fetched, model, repo_dir, sse_events, wait_for
from tests.hub import fixtures as fx

GEMMA = f"{fx.GEMMA_REPO}:Q4_K_M"
GEMMA_SIZE = 253113024
SLOW = 6_000_000  # bytes per second while a test needs the download to be in flight


def register(client: httpx.Client, name: str, checkpoint: str = GEMMA, **extra: Any) -> None:
    resp = client.post("/v1/models/register", json={"model_name": name, "recipe": "llamacpp",
                                                    "checkpoint": checkpoint, **extra})
    assert resp.status_code == 200, resp.text


def job(client: httpx.Client, name: str) -> dict[str, Any]:
    jobs = {j["id"]: j for j in client.get("/v1/downloads").json()}
    return jobs[f"model:{name.removeprefix('user.')}"]  # listed under the model's public id


def start_job(client: httpx.Client, name: str) -> dict[str, Any]:
    resp = client.post("/v1/pull", json={"model_name": name, "stream": True, "subscribe": False})
    assert resp.status_code == 200, resp.text
    return resp.json()


def partial_file(server, repo: str = fx.GEMMA_REPO, sha: str = fx.GEMMA_SHA256) -> Path:
    return repo_dir(server, repo) / "blobs" / f"{sha}.incomplete"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(4 << 20):
            h.update(block)
    return h.hexdigest()


JOB_FIELDS = {"id", "type", "model_name", "status", "running", "file", "file_index", "total_files",
              "bytes_downloaded", "bytes_total", "total_download_size", "bytes_previously_downloaded",
              "completed_files_bytes", "cumulative_bytes_downloaded", "overall_bytes_downloaded", "percent",
              "complete"}


@pytest.fixture(scope="module")
def server(module_servers, hub_server):
    return module_servers(env=hub_server.env())


@pytest.fixture
def client(server, hub):
    with server.client() as c:
        yield c


# ----- server-owned jobs ----------------------------------------------------------------------------

def test_job_pause_resume_cancel_remove(client, hub, server):
    register(client, "user.job-gemma")
    hub.throttle(SLOW, path=fx.GEMMA_FILE)
    snap = start_job(client, "user.job-gemma")
    assert set(snap) == JOB_FIELDS
    assert snap["id"] == "model:job-gemma" and snap["type"] == "model" and snap["model_name"] == "job-gemma"
    assert snap["status"] == "downloading" and snap["running"] is True and snap["complete"] is False
    # pulling again while it runs returns the same job
    assert start_job(client, "user.job-gemma")["status"] == "downloading"
    running = wait_for(lambda: (j := job(client, "user.job-gemma"))["bytes_downloaded"] > 2_000_000 and j,
                       what="progress")
    assert running["file"] == fx.GEMMA_FILE and running["file_index"] == 1 and running["total_files"] == 1
    assert running["bytes_total"] == running["total_download_size"] == GEMMA_SIZE
    assert running["cumulative_bytes_downloaded"] == running["overall_bytes_downloaded"]

    paused = client.post("/v1/downloads/control", json={"id": "model:user.job-gemma", "action": "pause"}).json()
    assert paused["status"] == "paused" and paused["id"] == "model:job-gemma"
    stopped = wait_for(lambda: (j := job(client, "user.job-gemma"))["running"] is False and j, what="pause")
    assert stopped["status"] == "paused" and stopped["complete"] is False
    partial = partial_file(server)
    kept = partial.stat().st_size
    assert 0 < kept < GEMMA_SIZE
    # a partial file never makes the model look downloaded
    assert model(client, "user.job-gemma")["downloaded"] is False
    [entry] = client.get("/v1/models/user.job-gemma/files").json()["files"]
    assert entry == {"name": fx.GEMMA_FILE, "role": "main", "size_bytes": 0, "exists": False}
    time.sleep(0.3)
    assert partial.stat().st_size == kept  # really stopped

    # pulling again resumes from the partial file
    hub.clear_requests()
    hub.throttle(None)
    start_job(client, "user.job-gemma")
    done = wait_for(lambda: (j := job(client, "user.job-gemma"))["running"] is False and j, what="completion")
    assert done["status"] == "completed" and done["complete"] is True and done["percent"] == 100
    assert done["bytes_previously_downloaded"] == kept
    assert "error" not in done
    [get] = fetched(hub, file=fx.GEMMA_FILE)
    assert get["range"] == f"bytes={kept}-" and get["bytes_sent"] == GEMMA_SIZE - kept
    assert model(client, "user.job-gemma")["downloaded"] is True
    blob = repo_dir(server, fx.GEMMA_REPO) / "blobs" / fx.GEMMA_SHA256
    assert sha256_of(blob) == fx.GEMMA_SHA256 and not partial.exists()
    # a finished job is left as it is
    # (a job is named by any id of its model: the listed `model:job-gemma` or `model:user.job-gemma`)
    again = client.post("/v1/downloads/control", json={"id": "model:job-gemma", "action": "cancel"}).json()
    assert again["status"] == "completed"
    assert client.post("/v1/downloads/control", json={"id": "model:user.job-gemma", "action": "remove"}).json() == {
        "status": "ok"}
    assert client.post("/v1/downloads/control", json={"id": "model:user.job-gemma", "action": "remove"}).json() == {
        "status": "ok", "missing": True}
    assert client.post("/v1/delete", json={"model_name": "user.job-gemma"}).status_code == 200


def test_job_cancel_and_remove_while_running(client, hub, server):
    register(client, "user.cancel-gemma")
    hub.throttle(SLOW, path=fx.GEMMA_FILE)
    start_job(client, "user.cancel-gemma")
    wait_for(lambda: job(client, "user.cancel-gemma")["bytes_downloaded"] > 1_000_000, what="progress")
    # remove while the worker runs = cancel; the job stays listed until the worker stops
    resp = client.post("/v1/downloads/control", json={"id": "model:user.cancel-gemma", "action": "remove"}).json()
    assert resp["status"] == "cancelled" and resp["id"] == "model:cancel-gemma"
    stopped = wait_for(lambda: (j := job(client, "user.cancel-gemma"))["running"] is False and j, what="cancel")
    assert stopped["status"] == "cancelled"
    # pausing a cancelled (stopped) job does not revive it
    resp = client.post("/v1/downloads/control", json={"id": "model:user.cancel-gemma", "action": "pause"}).json()
    assert resp["status"] == "cancelled" and resp["running"] is False
    assert partial_file(server).exists()  # the client decides: delete removes partial files
    resp = client.post("/v1/delete", json={"model_name": "user.cancel-gemma"})
    assert resp.status_code == 200, resp.text
    assert not partial_file(server).exists() and not repo_dir(server, fx.GEMMA_REPO).exists()
    assert client.post("/v1/downloads/control", json={"id": "model:user.cancel-gemma",
                                                      "action": "remove"}).json() == {"status": "ok"}
    assert all(j["id"] != "model:cancel-gemma" for j in client.get("/v1/downloads").json())


def test_job_errors_and_control_4xx(client, hub):
    register(client, "user.job-bad", checkpoint="test-org/no-such-repo:Q4_0")
    start_job(client, "user.job-bad")
    failed = wait_for(lambda: (j := job(client, "user.job-bad"))["running"] is False and j, what="failure")
    assert failed["status"] == "error" and "test-org/no-such-repo" in failed["error"]
    for body, needle in [({"action": "pause"}, "id"), ({"id": "model:user.job-bad"}, "action"),
                         ({"id": "model:user.job-bad", "action": "explode"}, "action"),
                         ({"id": 3, "action": "pause"}, "id")]:
        resp = client.post("/v1/downloads/control", json=body)
        assert resp.status_code == 400 and needle in error_of(resp)["message"], body
    for action in ("pause", "cancel"):
        resp = client.post("/v1/downloads/control", json={"id": "model:nobody", "action": action})
        assert resp.status_code == 404
    resp = client.post("/v1/downloads/control", content=b"{oops", headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert client.post("/v1/downloads/control", json={"id": "model:user.job-bad", "action": "remove"}).json() == {
        "status": "ok"}
    # a job for a model nobody knows: Lemonade's app gets its job, failed with the reason, until it removes it
    unknown = start_job(client, "No-Such-Model")
    assert unknown["id"] == "model:No-Such-Model" and unknown["status"] == "error" and not unknown["running"]
    assert "not a known model" in unknown["error"] and job(client, "No-Such-Model")["status"] == "error"
    assert client.post("/v1/downloads/control", json={"id": "model:No-Such-Model", "action": "remove"}).json() == {
        "status": "ok"}
    assert client.post("/v1/pull", json={"model_name": "No-Such-Model", "stream": True}).status_code == 404


def test_killed_server_comes_back_with_paused_job_and_resumes(make_server, hub, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    srv = make_server(env=hub.env(), cache=cache)
    hub.throttle(SLOW, path=fx.GEMMA_FILE)
    with srv.client() as c:
        register(c, "user.kill-gemma")
        start_job(c, "user.kill-gemma")
        hub.wait_for_download(fx.GEMMA_FILE, min_bytes=8_000_000)
        wait_for(lambda: job(c, "user.kill-gemma")["bytes_downloaded"] > 4_000_000, what="saved progress")
    time.sleep(1.2)  # the job state file is saved at most once a second while downloading
    srv.stop(sig=signal.SIGKILL)
    state = json.loads((cache / "downloads.json").read_text())
    # kept by canonical id on disk (it does not change when another model takes the bare name)
    assert [(j["id"], j["status"]) for j in state] == [("model:user.kill-gemma", "downloading")]
    kept = partial_file(srv).stat().st_size
    assert kept > 0

    hub.throttle(None)
    hub.clear_requests()
    srv = make_server(env=hub.env(), cache=cache)
    with srv.client() as c:
        restored = job(c, "user.kill-gemma")
        assert restored["status"] == "paused" and restored["running"] is False
        assert restored["bytes_downloaded"] > 0
        assert hub.requests(kind="cdn") == []  # nothing resumes by itself
        start_job(c, "user.kill-gemma")
        done = wait_for(lambda: (j := job(c, "user.kill-gemma"))["running"] is False and j, what="completion")
        assert done["status"] == "completed" and done["bytes_previously_downloaded"] == kept
        [get] = fetched(hub, file=fx.GEMMA_FILE)
        assert get["range"] == f"bytes={kept}-"
        assert model(c, "user.kill-gemma")["downloaded"] is True
    assert sha256_of(repo_dir(srv, fx.GEMMA_REPO) / "blobs" / fx.GEMMA_SHA256) == fx.GEMMA_SHA256


def test_abandoned_stream_stops_the_download(client, hub, server):
    """A client that hangs up on a streaming pull stops it (partial data kept for the next pull)."""
    register(client, "user.hangup-gemma")
    hub.throttle(SLOW, path=fx.GEMMA_FILE)
    with client.stream("POST", "/v1/pull", json={"model_name": "user.hangup-gemma", "stream": True}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data:") and json.loads(line[5:]).get("bytes_downloaded", 0) > 1_000_000:
                break
    partial = partial_file(server)
    size = wait_for(lambda: partial.exists() and partial.stat().st_size, what="partial file")
    time.sleep(1.0)
    settled = partial.stat().st_size
    time.sleep(0.5)
    assert partial.stat().st_size == settled >= size  # nobody is downloading any more
    hub.throttle(None)
    events = sse_events(client, {"model_name": "user.hangup-gemma"})
    assert events[-1][0] == "complete"
    assert events[0][1]["bytes_previously_downloaded"] == settled
    assert client.post("/v1/delete", json={"model_name": "user.hangup-gemma"}).status_code == 200


# ----- integrity, concurrency, disk ------------------------------------------------------------------

def test_corrupted_byte_is_detected_and_fetched_again(client, hub, server):
    target = "tiny-Q5_K_M.gguf"
    hub.corrupt(fx.MULTIQUANT_REPO, target, count=1)
    resp = client.post("/v1/pull", json={"model_name": "user.corrupt-once", "recipe": "llamacpp",
                                         "checkpoint": f"{fx.MULTIQUANT_REPO}:Q5_K_M"})
    assert resp.status_code == 200, resp.text
    gets = fetched(hub, file=target)
    assert len(gets) == 2 and gets[0]["injected"].startswith("corrupt")
    blob = repo_dir(server, fx.MULTIQUANT_REPO) / "blobs" / hub.sha256(fx.MULTIQUANT_REPO, target)
    assert sha256_of(blob) == hub.sha256(fx.MULTIQUANT_REPO, target)
    assert "Integrity check failed for tiny-Q5_K_M.gguf" in server.log_path.read_text()

    # A registry that always serves bad data: the pull fails, nothing is kept, nothing looks downloaded.
    target = "tiny-Q6_K.gguf"
    hub.corrupt(fx.MULTIQUANT_REPO, target, count=None)
    resp = client.post("/v1/pull", json={"model_name": "user.corrupt-always", "recipe": "llamacpp",
                                         "checkpoint": f"{fx.MULTIQUANT_REPO}:Q6_K"})
    assert resp.status_code == 502 and error_of(resp)["code"] == "download_corrupted"
    assert model(client, "user.corrupt-always")["downloaded"] is False
    folder = repo_dir(server, fx.MULTIQUANT_REPO)
    sha = hub.sha256(fx.MULTIQUANT_REPO, target)
    assert not (folder / "blobs" / sha).exists() and not (folder / "blobs" / f"{sha}.incomplete").exists()
    assert not list(folder.glob(f"snapshots/*/{target}"))


@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_a_pull_repairs_a_file_damaged_on_disk_since(client, hub, server, damage):
    """Files already in the cache are verified again by a pull (size and hash against the hub's
    metadata); a damaged one is fetched anew."""
    target, name = "tiny-Q4_0.gguf", f"user.rot-{damage.split()[0]}"
    pull = {"model_name": name, "recipe": "llamacpp", "checkpoint": f"{fx.MULTIQUANT_REPO}:Q4_0"}
    assert client.post("/v1/pull", json=pull).status_code == 200
    blob = repo_dir(server, fx.MULTIQUANT_REPO) / "blobs" / hub.sha256(fx.MULTIQUANT_REPO, target)
    before = len(fetched(hub, file=target))
    assert client.post("/v1/pull", json=pull).status_code == 200  # intact: nothing is fetched
    assert len(fetched(hub, file=target)) == before
    data = bytearray(blob.read_bytes())
    if damage == "truncated":
        del data[len(data) // 2:]
    else:
        data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    assert client.post("/v1/pull", json=pull).status_code == 200
    assert len(fetched(hub, file=target)) == before + 1
    assert sha256_of(blob) == hub.sha256(fx.MULTIQUANT_REPO, target)
    assert f"The cached copy of {target} of {fx.MULTIQUANT_REPO} is damaged" in server.log_path.read_text()
    assert client.post("/v1/delete", json={"model_name": name}).status_code == 200


def test_two_simultaneous_pulls_share_one_download(client, hub, server):
    register(client, "user.shared-gemma")
    hub.throttle(40_000_000, path=fx.GEMMA_FILE)
    results: dict[str, Any] = {}

    def plain() -> None:
        with server.client() as c:
            results["plain"] = c.post("/v1/pull", json={"model_name": "user.shared-gemma"})

    def streaming() -> None:
        with server.client() as c:
            results["sse"] = sse_events(c, {"model_name": "user.shared-gemma"})

    threads = [threading.Thread(target=plain), threading.Thread(target=streaming)]
    threads[0].start()
    hub.wait_for_download(fx.GEMMA_FILE, min_bytes=1)
    threads[1].start()
    for t in threads:
        t.join(300)
    assert results["plain"].status_code == 200, results["plain"].text
    assert results["sse"][-1][0] == "complete"
    later = [d for e, d in results["sse"] if e == "progress"]
    assert later and later[0]["bytes_downloaded"] > 0  # joined a download already under way
    gets = fetched(hub, file=fx.GEMMA_FILE)
    assert len(gets) == 1 and gets[0]["bytes_sent"] == GEMMA_SIZE
    assert client.post("/v1/delete", json={"model_name": "user.shared-gemma"}).status_code == 200


def _mount_tmpfs(mount: Path, size: int, remount: bool = False) -> subprocess.CompletedProcess:
    options = f"{'remount,' if remount else ''}size={size}"
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], capture_output=True)


@pytest.fixture
def small_disk(tmp_path):
    """A small tmpfs (root only) that the test can grow; unmounted afterwards."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    proc = _mount_tmpfs(mount, 100 << 20)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_full_disk_gives_a_clear_error_and_a_consistent_cache(make_server, hub, small_disk):
    srv = make_server(env=hub.env(), config={"models_dir": str(small_disk)})
    try:
        with srv.client() as c:
            register(c, "user.big-gemma")
            # Not enough room from the start: refused before a byte is written.
            resp = c.post("/v1/pull", json={"model_name": "user.big-gemma"})
            assert resp.status_code == 507, resp.text
            message = error_of(resp)["message"]
            assert "Not enough disk space" in message and str(small_disk) in message
            assert model(c, "user.big-gemma")["downloaded"] is False
            assert fetched(hub) == []

            # Room at the start, but the disk fills up while downloading.
            first, second = (hub.file_path(fx.SHARDED_REPO, f).stat().st_size for f in fx.SHARDED_FILES)
            assert _mount_tmpfs(small_disk, first + (16 << 20), remount=True).returncode == 0
            register(c, "user.sharded", checkpoint=f"{fx.SHARDED_REPO}:Q4_K_M")
            hub.throttle(SLOW, path=fx.SHARDED_REPO)
            filler = small_disk / "filler"
            events = []
            with c.stream("POST", "/v1/pull", json={"model_name": "user.sharded", "stream": True}) as resp:
                assert resp.status_code == 200
                for line in resp.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = json.loads(line[5:])
                    events.append(data)
                    if not filler.exists() and data.get("bytes_downloaded", 0) > 2_000_000:
                        with filler.open("wb") as fh:  # another program takes the rest of the disk
                            with contextlib.suppress(OSError):
                                while True:
                                    fh.write(b"\0" * (1 << 20))
                        hub.throttle(None)
            assert filler.exists()
            assert "error" in events[-1] and "Not enough disk space" in events[-1]["error"]
            assert model(c, "user.sharded")["downloaded"] is False
            folder = small_disk / ("models--" + fx.SHARDED_REPO.replace("/", "--"))
            assert not list(folder.glob("snapshots/*/*.gguf"))  # nothing half-written looks complete
            kept = sum(p.stat().st_size for p in folder.glob("blobs/*.incomplete"))
            assert kept > 0

            # Space is freed (and the disk grown): the same pull resumes and completes.
            filler.unlink()
            assert _mount_tmpfs(small_disk, first + second + (32 << 20), remount=True).returncode == 0
            hub.clear_requests()
            events = sse_events(c, {"model_name": "user.sharded"})
            assert events[-1][0] == "complete"
            assert events[0][1]["bytes_previously_downloaded"] == kept
            assert fetched(hub, file=fx.SHARDED_FILES[0])[0]["range"] == f"bytes={kept}-"
            assert model(c, "user.sharded")["downloaded"] is True
    finally:
        srv.stop()


# ----- offline ---------------------------------------------------------------------------------------

OFFLINE_WAYS = {
    "config": ({}, {"offline": True}),
    "LEMONADE_OFFLINE": ({"LEMONADE_OFFLINE": "1"}, None),
    "HF_HUB_OFFLINE": ({"HF_HUB_OFFLINE": "1"}, None),
}


@pytest.mark.parametrize("way", list(OFFLINE_WAYS))
def test_offline_mode_never_touches_the_network(make_server, hub, tmp_path, way):
    cache = tmp_path / "cache"
    cache.mkdir()
    online = make_server(env=hub.env(), cache=cache)
    with online.client() as c:
        assert c.post("/v1/pull", json={"model_name": "user.have", "recipe": "llamacpp",
                                        "checkpoint": f"{fx.MULTIQUANT_REPO}:Q4_0"}).status_code == 200
        register(c, "user.want", checkpoint=f"{fx.MULTIQUANT_REPO}:F16")
    online.stop()
    hub.clear_requests()
    env, config = OFFLINE_WAYS[way]
    srv = make_server(env={**hub.env(), **env}, cache=cache, config=config)
    with srv.client() as c:
        refusals = [
            c.post("/v1/pull", json={"model_name": "user.want"}),
            c.post("/v1/pull", json={"model_name": "user.want", "stream": True}),
            c.post("/v1/pull", json={"model_name": "user.want", "stream": True, "subscribe": False}),
            c.post("/v1/pull", json={"model_name": "user.new", "recipe": "llamacpp",
                                     "checkpoint": f"{fx.MULTIQUANT_REPO}:Q4_K_M"}),
            c.get("/v1/pull/variants", params={"checkpoint": fx.MULTIQUANT_REPO}),
            c.get("/v1/registry/search", params={"query": "gemma"}),
            c.get("/v1/registry/search", params={"query": "gemma", "source": "modelscope"}),
            c.post("/v1/load", json={"model_name": "user.want"}),
        ]
        for resp in refusals:
            assert resp.status_code == 400, resp.text
            err = error_of(resp)
            assert err["code"] == "lemond_offline" and "offline" in err["message"], resp.text
        chat = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            chat.chat.completions.create(model="user.want", messages=[{"role": "user", "content": "hi"}])
        assert "offline" in str(info.value)
        updates = c.post("/v1/models/check-updates")
        assert updates.status_code == 409 and "offline" in error_of(updates)["message"]
        assert c.get("/v1/models/user.new").status_code == 404  # refused registrations are not stored
        # what is on disk still works offline
        assert c.post("/v1/pull", json={"model_name": "user.have"}).json()["status"] == "success"
        assert c.get("/v1/models/user.have/files").json()["files"][0]["exists"] is True
        assert c.post("/v1/delete", json={"model_name": "user.have"}).status_code == 200
        assert c.get("/v1/health").json()["update_check_done"] is False
    assert hub.requests() == []


# ----- the downloaded model really works ------------------------------------------------------------

def test_inference_downloads_the_model_then_gemma_answers(make_server, hub):
    srv = make_server(env=hub.env())
    with srv.client() as c:
        register(c, "user.gemma")
        register(c, "user.gemma-sharded", checkpoint=f"{fx.SHARDED_REPO}:Q4_K_M")
        chat = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=600)
        for name in ("user.gemma", "user.gemma-sharded"):
            assert model(c, name)["downloaded"] is False
            resp = chat.chat.completions.create(model=name, messages=[{"role": "user", "content": "Say hello."}],
                                                max_tokens=8, temperature=0)
            assert resp.choices[0].message.content is not None and resp.usage.completion_tokens > 0, name
            assert model(c, name)["downloaded"] is True
        assert len(fetched(hub, file=fx.GEMMA_FILE)) == 1
        assert {e["file"] for e in fetched(hub, repo=fx.SHARDED_REPO)} == set(fx.SHARDED_FILES)
        files = c.get("/v1/models/user.gemma-sharded/files").json()["files"]
        assert [f["name"] for f in files] == list(fx.SHARDED_FILES) and all(f["exists"] for f in files)
        assert [f["role"] for f in files] == ["main"] + ["shard"] * (len(files) - 1)  # the first shard is "main"
        # delete unloads first, then removes the files
        loaded = {m["model_name"] for m in c.get("/v1/health").json()["all_models_loaded"]}
        assert "gemma-sharded" in loaded  # health shows the public id
        pids = srv.engine_pids()
        assert pids
        assert c.post("/v1/delete", json={"model_name": "user.gemma-sharded"}).status_code == 200
        assert c.get("/v1/health").json()["all_models_loaded"] == []
        wait_for(lambda: not any(_alive(pid) for pid in pids), timeout=30, what="engine exit")
        assert not repo_dir(srv, fx.SHARDED_REPO).exists()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(FileNotFoundError):
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    return False
