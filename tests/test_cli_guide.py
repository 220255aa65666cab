"""guide-cli.md's examples that need a server but no engine, run as written: the real CLI in a
subprocess against real servers (no model is loaded here; `tests/test_cli_chat.py` has the ones
that talk to a model).

- Discovery beacons (guide-cli.md "Options for scan", guide-configuration-README.md `broadcast`):
  real UDP datagrams, on loopback and on this machine's LAN broadcast address, from a real server
  to `lemonade scan`, to the CLI's own discovery, and to a plain socket.
- Global options (`--host`, `--port`, `--api-key` before or after the command; `LEMONADE_HOST`
  given as a URL), `--help-all`, `status --json`, `backends --all`, `telemetry on|off`.
- `pull` as the guide writes it (`--checkpoint ROLE VALUE` repeated, `--label`, `--alias`,
  `--components A B`) against the local Hugging Face hub, `export` to stdout and to a file, `list`
  sections, `config set` with flat keys.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers import ServerFactory, cli_env, config_dir_of, free_port, lemonade, ok

BEACON_WAIT = 6  # scan seconds: beacons leave every 2 s, so several are sent in that time


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    """Servers without any engine: nothing in this module loads a model."""
    factory = ServerFactory(tmp_path_factory, None)
    yield factory
    factory.close()


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


@pytest.fixture
def beacon_port() -> str:
    """A UDP port of the test's own, so no other server on this machine (13305 is the real one) is heard."""
    return str(free_udp_port())


def beaconing(servers: ServerFactory, beacon_port: str, **env: str) -> object:
    """A server that sends beacons (test servers do not by default): LEMONADE_BROADCAST unset."""
    return servers(env={"LEMONADE_BEACON_PORT": beacon_port, "LEMONADE_BROADCAST": "", **env}, engines=())


def scan(env: dict[str, str], seconds: float = BEACON_WAIT) -> str:
    return ok(lemonade("scan", "--duration", str(seconds), env=env, timeout=seconds + 60)).stdout


# ----- discovery beacons ---------------------------------------------------------------------------

def test_scan_hears_the_beacon_of_a_server_on_loopback(servers, beacon_port, tmp_path):
    srv = beaconing(servers, beacon_port)
    env = cli_env(tmp_path / "cache", LEMONADE_BEACON_PORT=beacon_port)
    text = scan(env)
    url = f"http://127.0.0.1:{srv.port}/api/v1/"
    assert f"Scanning for network beacons on port {beacon_port}" in text
    assert f"Discovered: {socket.gethostname()} at {url}" in text
    assert "Scan complete. Found 1 beacon(s):" in text and f"  - {socket.gethostname()} at {url}" in text
    assert "Discovery beacons on UDP port" in srv.log()


def test_broadcast_setting_turns_beacons_off_and_on_live(servers, beacon_port, tmp_path):
    srv = servers(env={"LEMONADE_BEACON_PORT": beacon_port, "LEMONADE_BROADCAST": ""}, config={"broadcast": False},
                  engines=())
    scan_env = cli_env(tmp_path / "cache", LEMONADE_BEACON_PORT=beacon_port)
    assert "No beacons discovered." in scan(scan_env, 3)
    server_env = cli_env(tmp_path / "cache")
    ok(lemonade("--port", str(srv.port), "config", "set", "broadcast=true", env=server_env))
    assert f"at http://127.0.0.1:{srv.port}/api/v1/" in scan(scan_env)
    assert json.loads((srv.config_dir / "config.json").read_text())["broadcast"] is True
    ok(lemonade("config", "set", "broadcast=false", "--port", str(srv.port), env=server_env))
    assert "No beacons discovered." in scan(scan_env, 3)


def test_serve_no_broadcast_flag_wins_over_the_setting(servers, beacon_port, tmp_path):
    servers(env={"LEMONADE_BEACON_PORT": beacon_port, "LEMONADE_BROADCAST": ""}, args=["--no-broadcast"],
            engines=())
    assert "No beacons discovered." in scan(cli_env(tmp_path / "cache", LEMONADE_BEACON_PORT=beacon_port), 3)


def _lan_address() -> tuple[str, str] | None:
    from lemonade.beacon import lan_interfaces

    found = lan_interfaces()
    return found[0] if found else None


@pytest.mark.skipif(_lan_address() is None, reason="this machine has no private IPv4 LAN address")
def test_a_server_on_the_lan_broadcasts_its_lan_address(servers, beacon_port, tmp_path):
    """A server listening on a LAN address announces that address on the LAN's broadcast address
    (a socket bound to the broadcast address receives only broadcasts), and on loopback."""
    ip, bcast = _lan_address()  # type: ignore[misc]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bcast, int(beacon_port)))
        sock.settimeout(BEACON_WAIT)
        srv = servers(env={"LEMONADE_BEACON_PORT": beacon_port, "LEMONADE_BROADCAST": ""}, args=["--host", ip],
                      engines=(), wait=False)
        srv.url = f"http://{ip}:{srv.port}"
        srv.wait_live()
        data, (sender, _) = sock.recvfrom(1024)
    beacon = json.loads(data)
    assert beacon == {"service": "lemonade", "hostname": socket.gethostname(),
                      "url": f"http://{ip}:{srv.port}/api/v1/"}
    assert sender == ip
    assert f"Discovered: {socket.gethostname()} at http://{ip}:{srv.port}/api/v1/" in \
        scan(cli_env(tmp_path / "cache", LEMONADE_BEACON_PORT=beacon_port))


def test_the_cli_finds_a_local_server_by_its_beacon(servers, beacon_port, tmp_path):
    """Nothing says where the server is and nothing answers at the configured port: the server that
    announces itself on this machine is used; --no-discovery, or any address given, turns that off."""
    srv = beaconing(servers, beacon_port)
    cache = tmp_path / "cache"
    config_dir_of(cache).mkdir()
    (config_dir_of(cache) / "config.json").write_text(json.dumps({"port": free_port()}))  # nobody listens there
    env = cli_env(cache, LEMONADE_BEACON_PORT=beacon_port)
    proc = ok(lemonade("status", env=env))
    assert f"running at {srv.url}" in proc.stdout and "announced itself" in proc.stderr
    assert json.loads(ok(lemonade("status", "--json", env=env)).stdout)["port"] == srv.port
    proc = lemonade("--no-discovery", "status", env=env)
    assert proc.returncode == 3 and "Could not connect to Lemonade server" in proc.stderr
    proc = lemonade("status", env={**env, "LEMONADE_PORT": str(free_port())})
    assert proc.returncode == 3
    # commands that work on this machine's files when no server runs never use another's server
    proc = ok(lemonade("config", "get", "port", env=env))
    assert "No server running" in proc.stderr and "announced" not in proc.stderr


# ----- global options and the server's address ---------------------------------------------------

@pytest.fixture(scope="module")
def plain(servers) -> object:
    return servers(env={"LEMONADE_API_KEY": "sekret"}, engines=())


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """A CLI environment that says nothing about where the server is."""
    return cli_env(tmp_path / "cache", LEMONADE_API_KEY="sekret")


@pytest.mark.parametrize("args", [
    ["--host", "127.0.0.1", "--port", "{port}", "status"],
    ["status", "--host", "127.0.0.1", "--port", "{port}"],
    ["--port", "{port}", "status", "--api-key", "sekret"],
    ["--api-key", "sekret", "--port", "{port}", "list", "--downloaded"],
    ["list", "--port", "{port}", "--downloaded", "--api-key", "sekret"],
    ["--port", "{port}", "--no-discovery", "status"],
    ["--port", "{port}", "--discovery", "status"],
])
def test_global_options_before_or_after_the_command(plain, env, args):
    env = {k: v for k, v in env.items() if k != "LEMONADE_API_KEY"}
    if "--api-key" not in args:
        env["LEMONADE_API_KEY"] = "sekret"
    ok(lemonade(*[a.replace("{port}", str(plain.port)) for a in args], env=env))


def test_the_api_key_option_after_the_command_wins_over_the_environment(plain, env):
    proc = lemonade("status", "--port", str(plain.port), "--api-key", "wrong", env=env)
    assert proc.returncode == 1 and "401" in proc.stderr


@pytest.mark.parametrize("host, extra", [
    ("http://127.0.0.1:{port}", {}),
    ("http://127.0.0.1:{port}/api/v1/", {}),
    ("http://127.0.0.1", {"LEMONADE_PORT": "{port}"}),
    ("127.0.0.1", {"LEMONADE_PORT": "{port}"}),
])
def test_lemonade_host_may_be_a_url(plain, env, host, extra):
    """issue 29: `LEMONADE_HOST=http://127.0.0.1` (as people paste it) used to give http://http://..."""
    fill = {k: v.replace("{port}", str(plain.port)) for k, v in extra.items()}
    proc = ok(lemonade("status", env={**env, "LEMONADE_HOST": host.replace("{port}", str(plain.port)), **fill}))
    assert f"running at {plain.url}" in proc.stdout


def test_a_url_host_keeps_its_scheme_and_bad_ones_are_refused(plain, env):
    port = free_port()
    proc = lemonade("status", env={**env, "LEMONADE_HOST": f"https://127.0.0.1:{port}"})
    assert proc.returncode == 3 and f"https://127.0.0.1:{port}" in proc.stderr and "TLS" in proc.stderr
    proc = lemonade("status", "--host", f"https://127.0.0.1:{plain.port}", env=env)  # TLS to a plain HTTP server
    assert proc.returncode == 3 and f"https://127.0.0.1:{plain.port}" in proc.stderr
    for bad in ("ftp://127.0.0.1", "http://"):
        proc = lemonade("status", env={**env, "LEMONADE_HOST": bad})
        assert proc.returncode == 2 and "LEMONADE_HOST must be" in proc.stderr and bad in proc.stderr
    proc = lemonade("status", "--host", "gopher://x", env=env)
    assert proc.returncode == 2 and "--host must be" in proc.stderr


def test_help_all_version_and_command_help(env):
    from lemonade import __version__

    assert ok(lemonade("--version", env=env)).stdout.strip() == f"lemonade {__version__}"
    text = ok(lemonade("--help-all", env=env)).stdout
    for command in ("lemonade run", "lemonade chat", "lemonade scan", "lemonade telemetry", "lemonade backends install",
                    "lemonade alias add", "lemonade cloud install", "lemonade pull"):
        assert command in text, command
    assert "--chat-cli" in text and "--components" in text and "--duration" in text
    for command in ("run", "load"):  # recipe options grouped as the guide groups them
        text = ok(lemonade(command, "--help", env={**env, "COLUMNS": "200"})).stdout
        for panel, flags in (("General Options", ("--ctx-size", "--merge-args", "--save-options", "--pinned")),
                             ("Llama.cpp Backend Options", ("--llamacpp", "--llamacpp-device", "--llamacpp-args")),
                             ("Whisper.cpp Options", ("--whispercpp", "--whispercpp-args")),
                             ("Stable Diffusion Options", ("--steps", "--cfg-scale", "--width", "--height")),
                             ("vLLM Options", ("--vllm", "--vllm-args"))):
            section = text[text.index(f"\n{panel}:\n"):].split("\n\n")[0]  # a heading, then one line a flag
            for flag in flags:
                assert re.search(rf"^  {re.escape(flag)}[ ,\n]", section + "\n", re.M), (command, panel, flag)
    # launch: its help lists the agents; an agent's help, that agent's options (as Lemonade's does)
    helps = {agent: ok(lemonade("launch", *agent, "--help", env={**env, "COLUMNS": "200"})).stdout
             for agent in ((), ("claude",), ("codex",))}
    assert "Agents: claude, codex, opencode, pi" in helps[()] and "--model" not in helps[()]
    assert "--model" in helps[("claude",)] and "--agent-args" in helps[("claude",)]
    assert "--provider" not in helps[("claude",)]
    assert "--provider" in helps[("codex",)] and "Use model provider name for Codex" in helps[("codex",)]


def test_every_recipe_option_has_a_load_flag():
    """A new engine option cannot go unexposed: `load`/`run` take every option of /v1/load."""
    from lemonade.cli.load_options import FLAGS
    from lemonade.runtime.options import all_options

    assert {f.key for f in FLAGS} == set(all_options())


def test_status_json_backends_all_and_telemetry(plain, env):
    env = {**env, "LEMONADE_PORT": str(plain.port)}
    status = json.loads(ok(lemonade("status", "--json", env=env)).stdout)
    assert status["port"] == plain.port and status["url"] == plain.url and "all_models_loaded" in status
    supported = json.loads(ok(lemonade("backends", "--json", env=env)).stdout)
    everything = json.loads(ok(lemonade("backends", "--all", "--json", env=env)).stdout)
    with httpx.Client(base_url=plain.url, headers={"Authorization": "Bearer sekret"}) as c:
        recipes = c.get("/v1/system-info").json()["recipes"]
    assert len(everything) == sum(len(r["backends"]) for r in recipes.values())
    assert supported == [r for r in everything if r["state"] != "unsupported"] and len(supported) < len(everything)
    assert "unsupported" not in ok(lemonade("backends", env=env)).stdout
    assert "unsupported" in ok(lemonade("backends", "--all", env=env)).stdout
    proc = ok(lemonade("telemetry", "on", env=env))
    assert "Telemetry successfully turned on." in proc.stdout
    with httpx.Client(base_url=plain.url, headers={"Authorization": "Bearer sekret"}) as c:
        assert c.get("/v1/health").json()["telemetry"]["enabled"] is True
        assert ok(lemonade("telemetry", "off", env=env)).stdout.strip() == "Telemetry successfully turned off."
        assert c.get("/v1/health").json()["telemetry"]["enabled"] is False
    saved = plain.config_dir / "config.json"
    assert "telemetry" not in (json.loads(saved.read_text()) if saved.exists() else {})  # in memory only
    assert lemonade("telemetry", "maybe", env=env).returncode == 2


def test_config_set_takes_flat_keys_as_the_docs_write_them(plain, env):
    env = {**env, "LEMONADE_PORT": str(plain.port)}
    proc = ok(lemonade("config", "set", "vllm_args=--max-num-seqs 128", "llamacpp_backend=cpu", env=env))
    assert 'vllm.args = "--max-num-seqs 128"' in proc.stdout and 'llamacpp.backend = "cpu"' in proc.stdout
    assert ok(lemonade("config", "get", "vllm.args", env=env)).stdout.strip() == "--max-num-seqs 128"
    ok(lemonade("config", "set", "vllm.args=", env=env))
    assert ok(lemonade("config", "get", "vllm.args", env=env)).stdout.strip() == ""
    proc = lemonade("config", "set", "vllm_nope=1", env=env)
    assert proc.returncode == 2 and "vllm_nope" in proc.stderr


# ----- pull, list, export against the local hub ----------------------------------------------------

@pytest.fixture(scope="module")
def hubbed(servers, hub_server) -> object:
    return servers(env=hub_server.env(), engines=())


@pytest.fixture
def tiny_repo(hub) -> str:
    from tests.hub.fixtures import write_tiny_gguf

    repo = "cli-org/tiny-vision-GGUF"
    folder = hub.create_repo(repo)
    write_tiny_gguf(folder / "tiny-Q4_0.gguf", name="tiny")
    write_tiny_gguf(folder / "mmproj-tiny-f16.gguf", name="mmproj", seed=1)
    return repo


def test_pull_as_the_guide_writes_it(hubbed, tiny_repo, tmp_path):
    env = cli_env(tmp_path / "cache", hubbed.url)
    proc = ok(lemonade("pull", "user.CliTiny", "--checkpoint", "main", f"{tiny_repo}:tiny-Q4_0.gguf",
                       "--checkpoint", "mmproj", f"{tiny_repo}:mmproj-tiny-f16.gguf", "--recipe", "llamacpp",
                       "--label", "vision", "--label", "reasoning", "--alias", "cli-tiny", env=env))
    assert "Installed model: user.CliTiny" in proc.stdout and "cli-tiny" in proc.stdout
    with httpx.Client(base_url=hubbed.url) as c:
        entry = c.get("/v1/models/user.CliTiny").json()
        assert entry["checkpoints"] == {"main": f"{tiny_repo}:tiny-Q4_0.gguf",
                                        "mmproj": f"{tiny_repo}:mmproj-tiny-f16.gguf"}
        assert set(entry["labels"]) >= {"vision", "reasoning"} and entry["downloaded"] is True
        assert c.get("/v1/models/cli-tiny").json()["alias_target"] == entry["id"]
    # an omni collection from components given as the guide writes them (the last one pulled too)
    proc = ok(lemonade("pull", "user.CliKit", "--recipe", "collection.omni", "--components", "user.CliTiny",
                       "cli-tiny", env=env))
    with httpx.Client(base_url=hubbed.url) as c:
        kit = c.get("/v1/models/user.CliKit").json()
    # components are listed by public id, as Lemonade lists them (the alias is the model it names)
    assert kit["recipe"] == "collection.omni" and kit["components"] == ["CliTiny", "CliTiny"]
    # list: the two sections, every row's first words its id and Yes/No
    text = ok(lemonade("list", env=env)).stdout
    lines = text.splitlines()
    assert lines[0] == "Local" and "Available for Download" in lines
    local = lines[:lines.index("Available for Download")]
    remote = lines[lines.index("Available for Download"):]
    row = next(line for line in local if line.split()[:1] == ["CliTiny"] or line.split()[:1] == ["user.CliTiny"])
    assert row.split()[1] == "Yes" and "llamacpp" in row and "vision" in row
    assert all(line.split()[1] == "No" for line in remote[3:-1])
    downloaded = ok(lemonade("list", "--downloaded", env=env)).stdout.splitlines()
    assert "Local" not in downloaded and downloaded[0].split() == ["Model", "Name", "Downloaded", "Size", "Details"]
    # export: stdout by default, a file with --output
    exported = json.loads(ok(lemonade("export", "user.CliTiny", env=env)).stdout)
    assert exported["model_name"] == "user.CliTiny" and exported["checkpoints"]["mmproj"].endswith("f16.gguf")
    target = tmp_path / "model-info.json"
    proc = ok(lemonade("export", "user.CliTiny", "--output", str(target), env=env))
    assert json.loads(target.read_text()) == exported and str(target) in proc.stdout


def test_pull_with_a_dflash_draft_as_the_custom_models_guide_lists_it(hubbed, hub, tmp_path):
    """guide-configuration-custom-models.md lists `dflash` among the labels `--label` takes: a DFlash
    drafter registered as the `draft` checkpoint with it (the label selects DFlash decoding)."""
    from tests.hub.fixtures import write_tiny_gguf

    repo = "cli-org/tiny-dflash-GGUF"
    folder = hub.create_repo(repo)
    write_tiny_gguf(folder / "tiny-Q8_0.gguf", name="tiny")
    write_tiny_gguf(folder / "dflash-kquant.gguf", name="dflash", seed=1)
    env = cli_env(tmp_path / "cache", hubbed.url)
    ok(lemonade("pull", "user.CliDflash", "--checkpoint", "main", f"{repo}:tiny-Q8_0.gguf", "--checkpoint", "draft",
                f"{repo}:dflash-kquant.gguf", "--recipe", "llamacpp", "--label", "dflash", env=env))
    with httpx.Client(base_url=hubbed.url) as c:
        entry = c.get("/v1/models/user.CliDflash").json()
    assert "dflash" in entry["labels"] and entry["downloaded"] is True
    assert entry["checkpoints"] == {"main": f"{repo}:tiny-Q8_0.gguf", "draft": f"{repo}:dflash-kquant.gguf"}


@pytest.mark.parametrize("args, text", [
    (["--checkpoint", "main", "cli-org/x:x.gguf", "--recipe", "llamacpp", "--label", "invalid-label"],
     "'invalid-label' is not a label"),
    (["--recipe", "collection.omni"], "--components"),
    (["--components", "a", "b", "--recipe", "llamacpp"], "--components"),
])
def test_pull_usage_errors_are_refused_before_anything_is_sent(hubbed, hub, tmp_path, args, text):
    env = cli_env(tmp_path / "cache", hubbed.url)
    proc = lemonade("pull", "user.Refused", *args, env=env)
    assert proc.returncode == 2 and text in proc.stderr and "Run with --help for more information." in proc.stderr
    assert hub.requests() == []
    with httpx.Client(base_url=hubbed.url) as c:
        assert c.get("/v1/models/user.Refused").status_code == 404


def test_list_on_a_server_with_nothing(tmp_path):
    """An empty catalog (a stand-in answering /v1/models with no data): `No models available`."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Empty(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = b'{"object": "list", "data": []}' if "/models" in self.path else b"{}"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Empty)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        env = cli_env(tmp_path / "cache", LEMONADE_HOST=f"http://127.0.0.1:{httpd.server_address[1]}")
        assert ok(lemonade("list", env=env)).stdout.strip() == "No models available"
        assert ok(lemonade("list", "--downloaded", env=env)).stdout.strip() == "No local models downloaded."
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_help_is_quick_to_load():
    """`lemonade --help` must not import the server, the engines or the HTTP clients' heavy parts."""
    code = ("import sys, lemonade.cli.main as m\nm._register_commands()\n"  # every command, as --help lists them
            "heavy = [m for m in ('lemonade.server', 'lemonade.backends.registry', 'lemonade.api.app', 'openai', "
            "'uvicorn', 'fastapi', 'psutil.tests') if m in sys.modules]\n"
            "print(','.join(heavy))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "", proc.stdout + proc.stderr


@pytest.mark.parametrize("args, command", [
    (["chat", "SD-Turbo"], 'lemonade generate "a lemon on the moon" -m SD-Turbo'),
    (["run", "--chat-cli", "kokoro-v1"], 'lemonade speak "Hello" -m kokoro-v1'),
    (["chat", "Whisper-Tiny"], "lemonade transcribe recording.wav -m Whisper-Tiny"),
    (["chat", "RealESRGAN-x4plus"], "lemonade upscale PICTURE.png -m RealESRGAN-x4plus"),
])
def test_chat_names_the_command_for_a_model_that_does_not_chat(plain, env, args, command):
    """Instead of a chat that refuses every message: what to use, before anything is loaded or downloaded."""
    proc = lemonade(*args, "--port", str(plain.port), env=env, stdin="Hello\n")
    assert proc.returncode == 2 and command in " ".join(proc.stderr.split()) and proc.stdout == ""
    with httpx.Client(base_url=plain.url, headers={"Authorization": "Bearer sekret"}) as c:
        assert c.get("/v1/health").json()["all_models_loaded"] == []
        assert c.get("/v1/models").json()["data"] == []  # nothing was downloaded


def test_chat_without_a_model_and_nothing_loaded_says_what_to_name(plain, env):
    proc = lemonade("chat", "--port", str(plain.port), env=env, stdin="Hello\n")
    assert proc.returncode == 2 and "lemonade chat MODEL" in proc.stderr and "lemonade pull" in proc.stderr
