"""`lemond`, the server executable under the name and arguments Lemonade gives it
(guide-configuration-README.md, "lemond CLI"), started as the installed console script."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import answers_live, free_port, wait_for

LEMOND = Path(sys.executable).with_name("lemond")


@pytest.fixture
def lemond(tmp_path) -> Iterator:
    """Starts `lemond ARGS` in a clean environment (HOME in tmp_path: nothing found in the user's
    folders); every one started is stopped by pid."""
    started: list[subprocess.Popen] = []

    def start(*args: str) -> tuple[subprocess.Popen, str]:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMONADE_", "HF_", "XDG_"))}
        env.update(HOME=str(tmp_path / "home"), LEMONADE_BROADCAST="false")
        log = open(tmp_path / f"lemond-{port}.log", "wb")  # noqa: SIM115 - the process writes it
        proc = subprocess.Popen([str(LEMOND), *args, "--port", str(port)], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        started.append(proc)
        wait_for(lambda: proc.poll() is not None or answers_live(port), timeout=60)
        assert proc.poll() is None, (tmp_path / f"lemond-{port}.log").read_text()
        return proc, f"http://127.0.0.1:{port}"

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_cache_dir_alone_keeps_the_config_with_it(lemond, tmp_path):
    """A portable install: `lemond DIR` reads and writes config.json (and every persistent JSON) in DIR;
    `--port` serves there for this process without being saved."""
    portable = tmp_path / "portable"
    portable.mkdir()
    (portable / "config.json").write_text(json.dumps({"max_loaded_models": 3}))
    proc, url = lemond(str(portable))
    assert httpx.get(url + "/internal/config").json()["max_loaded_models"] == 3
    assert httpx.post(url + "/internal/set", json={"ctx_size": 2048}).status_code == 200
    assert httpx.post(url + "/internal/aliases", json={"alias": "mine", "model": "Qwen3-0.6B-GGUF"}).status_code == 200
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    saved = json.loads((portable / "config.json").read_text())
    assert saved == {"max_loaded_models": 3, "ctx_size": 2048}  # the port override is not saved
    assert (portable / "aliases.json").exists()
    assert not (tmp_path / "home" / ".config" / "lemonade").exists()


def test_cache_and_config_dirs_given_apart(lemond, tmp_path):
    cache, config = tmp_path / "cache", tmp_path / "config"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"max_loaded_models": 4}))
    _, url = lemond(str(cache), str(config))
    assert httpx.get(url + "/internal/config").json()["max_loaded_models"] == 4
    assert httpx.post(url + "/internal/set", json={"ctx_size": 4096}).status_code == 200
    assert json.loads((config / "config.json").read_text())["ctx_size"] == 4096
    assert not (cache / "config.json").exists()


def test_version_and_a_bad_port():
    from lemonade import __version__

    version = subprocess.run([str(LEMOND), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.strip() == f"lemond version {__version__}"
    bad = subprocess.run([str(LEMOND), "--port", "99999"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "port" in bad.stderr and "99999" in bad.stderr
