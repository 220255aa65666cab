"""`inhibit_suspend` (guide-configuration-README.md): a systemd-logind inhibitor lock held while a
model works, released when the server is idle (system/suspend.py).

The server takes the lock through `systemd-inhibit`. This machine has no logind, so to watch a lock
being taken and dropped, two tests put a stand-in `systemd-inhibit` first on the server's PATH: a
shell script that records when it starts (with its arguments) and when it ends, and in between runs
the command it was given, as the real one does once logind granted the lock. What it records is the
lock's lifetime as logind would see it. The last test runs the real `systemd-inhibit`, which fails
here for want of logind: the server says so once in its log and serves on.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from openai import OpenAI

from tests.helpers import GEMMA_NAME, Server, ServerFactory, wait_for

FAKE = """#!/bin/sh
# systemd-inhibit's stand-in: the lock lives as long as this process (see tests/test_suspend.py)
echo "start $$ $(date +%s.%N) $*" >> "$FAKE_INHIBIT_RECORD"
while [ $# -gt 0 ]; do case "$1" in --*) shift ;; *) break ;; esac; done
"$@"
status=$?
echo "end $$ $(date +%s.%N)" >> "$FAKE_INHIBIT_RECORD"
exit $status
"""
LONG = {"max_tokens": 2000, "extra_body": {"ignore_eos": True}}  # runs for seconds: the lock must show
MESSAGES = [{"role": "user", "content": "Tell me a long story about a lemon."}]


def fake_inhibit(folder: Path) -> tuple[dict[str, str], Path]:
    """The environment that puts the stand-in first on PATH, and the file it records to."""
    bindir = folder / "bin"
    bindir.mkdir()
    script = bindir / "systemd-inhibit"
    script.write_text(FAKE)
    script.chmod(0o755)
    record = folder / "inhibit.log"
    return {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "FAKE_INHIBIT_RECORD": str(record)}, record


def locks(record: Path) -> dict[str, dict[str, object]]:
    """pid -> {"start": time, "args": [...], "end": time or None} of every lock the server took."""
    out: dict[str, dict[str, object]] = {}
    for line in record.read_text().splitlines() if record.exists() else []:
        kind, pid, when, *args = line.split()
        entry = out.setdefault(pid, {"end": None})
        entry[kind] = float(when)
        if kind == "start":
            entry["args"] = args
    return out


def held(record: Path) -> list[dict[str, object]]:
    return [lock for lock in locks(record).values() if lock["end"] is None]


@pytest.fixture
def watched(make_server: ServerFactory, gemma_dir: Path, tmp_path: Path) -> tuple[Server, Path]:
    env, record = fake_inhibit(tmp_path)
    return make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir), **env}), record


def test_the_lock_is_held_while_a_model_works_and_dropped_when_idle(watched):
    server, record = watched
    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    assert client.chat.completions.create(model=GEMMA_NAME, messages=MESSAGES, max_tokens=2).choices  # loads it
    wait_for(lambda: not held(record), timeout=20, what="no lock while idle")

    began = time.time()
    with client.chat.completions.create(model=GEMMA_NAME, messages=MESSAGES, stream=True, **LONG) as stream:
        chunks = iter(stream)
        while not held(record):  # the lock comes while the answer is being written...
            next(chunks)
        [lock] = held(record)
        assert lock["start"] >= began
        assert lock["args"][:4] == ["--what=sleep:idle", "--who=lemonade", "--why=Inference", "in"]
        assert "--mode=block" in lock["args"]
        for _ in range(20):  # ...stays while it goes on...
            next(chunks)
        assert held(record) == [lock]
        left = time.time()
    # ...and goes once nothing runs (here the client left, which stopped the generation)
    wait_for(lambda: not held(record), timeout=20, what="the lock to be released")
    [ended] = [entry for entry in locks(record).values() if entry["start"] == lock["start"]]
    assert ended["end"] >= left

    taken = len(locks(record))
    with server.client() as c:  # turned off: no lock is taken
        assert c.post("/internal/set", json={"inhibit_suspend": False}).status_code == 200
    assert client.chat.completions.create(model=GEMMA_NAME, messages=MESSAGES, max_tokens=50).choices
    time.sleep(2)  # two turns of the watch
    assert len(locks(record)) == taken


def test_a_killed_server_leaves_no_lock_behind(watched):
    server, record = watched
    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    with client.chat.completions.create(model=GEMMA_NAME, messages=MESSAGES, stream=True, **LONG) as stream:
        chunks = iter(stream)
        while not held(record):
            next(chunks)
        # Only the server is killed (Server.stop would also kill its children by pid, the lock's among
        # them): nothing of ours runs any more, so the pipe the lock hangs on closes.
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(30)
    wait_for(lambda: not held(record), timeout=20, what="the lock of a killed server to end")


@pytest.mark.skipif(shutil.which("systemd-inhibit") is None
                    or subprocess.run(["systemd-inhibit", "--what=idle", "true"], capture_output=True).returncode == 0,
                    reason="systemd-logind answers on this machine: the path under test is the one without it")
def test_without_logind_the_server_says_so_once_and_serves(make_server: ServerFactory, gemma_dir: Path):
    server = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    for _ in range(2):
        reply = client.chat.completions.create(model=GEMMA_NAME, messages=MESSAGES, max_tokens=30)
        assert reply.choices[0].message.content
    said = wait_for(lambda: [line for line in server.log().splitlines() if "inhibit_suspend:" in line], timeout=20)
    assert len(said) == 1, said
    assert "systemd-inhibit could not take the lock" in said[0] and "inhibit_suspend=false" in said[0]
