"""The `lemonade` command line, run for real (`python -m lemonade.cli.main ...` in a subprocess)
against real servers from the fixtures: tables, JSON output, exit codes, the "no server" message,
config on disk and through the server, backends, load/unload, and `chat` talking to the real
Gemma 3 270M model through piped stdin (including `chat` starting a server by itself).

Exit codes checked here: 0 ok, 1 the server refused, 2 bad usage or refused value, 3 no server.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.helpers import GEMMA_NAME, cli_env, config_dir_of, free_port, lemonade, ok, served_folder

NO_SERVER = "Could not connect to Lemonade server"


@pytest.fixture
def nowhere(tmp_path: Path) -> dict[str, str]:
    """Env of a CLI whose server is not running (a free port nobody listens on)."""
    return cli_env(tmp_path / "cache", f"http://127.0.0.1:{free_port()}")


@pytest.fixture(scope="module")
def env(gemma_server, tmp_path_factory) -> dict[str, str]:
    """Env of a CLI talking to the module's Gemma server."""
    return cli_env(tmp_path_factory.mktemp("cli-cache"), gemma_server.url)


# ----- without a server ------------------------------------------------------------------------

def test_version(nowhere):
    from lemonade import __version__

    assert ok(lemonade("--version", env=nowhere)).stdout.strip() == f"lemonade {__version__}"


@pytest.mark.parametrize("args", [
    ["status"], ["list"], ["list", "--all"], ["alias", "list"], ["alias", "add", "a", "b"], ["alias", "remove", "a"],
    ["load", GEMMA_NAME], ["unload"], ["unload", GEMMA_NAME], ["run", "--no-start", GEMMA_NAME],
    ["chat", "--no-start", GEMMA_NAME],
])
def test_commands_that_need_a_server_say_how_to_start_one(nowhere, args):
    proc = lemonade(*args, env=nowhere)
    assert proc.returncode == 3
    assert NO_SERVER in proc.stderr and "lemonade serve" in proc.stderr
    assert nowhere["LEMONADE_BASE_URL"] in proc.stderr


def test_config_on_disk_without_a_server(nowhere):
    folder = Path(nowhere["LEMONADE_CONFIG_DIR"])
    proc = ok(lemonade("config", "set", "llamacpp.args=--slot-save-path /x", "max_loaded_models=2", env=nowhere))
    assert "max_loaded_models = 2" in proc.stdout and "No server running" in proc.stderr
    assert json.loads((folder / "config.json").read_text()) == {"llamacpp": {"args": "--slot-save-path /x"},
                                                               "max_loaded_models": 2}
    assert ok(lemonade("config", "get", "max_loaded_models", env=nowhere)).stdout.strip() == "2"
    assert ok(lemonade("config", "get", "llamacpp.args", env=nowhere)).stdout.strip() == "--slot-save-path /x"
    everything = json.loads(ok(lemonade("config", "get", env=nowhere)).stdout)
    assert everything["llamacpp"] == {"backend": "auto", "args": "--slot-save-path /x", "device": "",
                                      "speculation": "auto",
                                      "prefer_system": False, "rpc_workers": [], "cpu_bin": "builtin",
                                      "vulkan_bin": "builtin", "rocm_bin": "builtin", "cuda_bin": "builtin",
                                      "cpu_args": "", "system_args": "", "vulkan_args": "", "rocm_args": "",
                                      "cuda_args": "", "metal_args": ""}
    assert everything["port"] == 13305  # defaults are filled in
    ok(lemonade("config", "set", "offline=true", "sdcpp.cfg_scale=5", env=nowhere))
    saved = json.loads((folder / "config.json").read_text())
    assert saved["offline"] is True and saved["sdcpp"] == {"cfg_scale": 5.0} and saved["max_loaded_models"] == 2


@pytest.mark.parametrize("args, named", [
    (["bogus=1"], "bogus"),
    (["max_loaded_models=abc"], "max_loaded_models"),
    (["max_loaded_models=0"], "max_loaded_models"),
    (["port=70000"], "port"),
    (["offline=maybe"], "offline"),
    (["llamacpp.backend=opencl"], "llamacpp.backend"),
    (["llamacpp.nope=1"], "llamacpp.nope"),
    (["llamacpp=cpu"], "llamacpp"),
    (["max_loaded_models"], "max_loaded_models"),  # no '='
    (["ctx_size=4096", "log_level=loud"], "log_level"),  # one bad value: nothing is written
])
def test_config_set_refuses_invalid_and_leaves_the_file_alone(nowhere, args, named):
    path = Path(nowhere["LEMONADE_CONFIG_DIR"]) / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"max_loaded_models": 3}))
    before = path.read_bytes(), path.stat().st_mtime_ns
    proc = lemonade("config", "set", *args, env=nowhere)
    assert proc.returncode == 2
    assert f"'{named}'" in proc.stderr
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before


def test_config_alone_shows_every_setting(nowhere):
    """guide-configuration-README.md: `lemonade config` views all current settings, as Lemonade's CLI
    shows them: by section, each key spelled as `config set` takes it (a flat `vllm_args` set shows
    as `vllm.args`)."""
    ok(lemonade("config", "set", "vllm_args=--max-num-seqs 128", env=nowhere))
    lines = ok(lemonade("config", env=nowhere)).stdout.splitlines()
    assert lines[0] == "Server Configuration" and "  [General]" in lines and "  [llamacpp]" in lines
    rows = {line.split()[0]: line.split(None, 1)[1] for line in lines if line.startswith("  ") and "[" not in line[:3]}
    assert rows["port"] == "13305" and rows["vllm.args"] == "--max-num-seqs 128"
    assert rows["extra_models_dir"] == "(empty)" and rows["telemetry.otlp.semantics"].startswith('["')
    everything = json.loads(ok(lemonade("config", "get", env=nowhere)).stdout)  # the JSON, for scripts
    assert everything["vllm"]["args"] == "--max-num-seqs 128"


@pytest.mark.parametrize("url, code, text", [
    ("localhost:13305", 2, "must be a URL starting with http:// or https://"),
    ("ftp://127.0.0.1:13305", 2, "must be a URL starting with http:// or https://"),
    ("http://", 2, "must be a URL starting with http:// or https://"),
])
def test_base_url_scheme_is_checked(tmp_path, url, code, text):
    proc = lemonade("status", env=cli_env(tmp_path / "cache", url))
    assert proc.returncode == code and text in proc.stderr and url in proc.stderr


def test_a_server_that_serves_only_lemonades_api_prefix(tmp_path):
    """Lemonade's own CLI test (server_cli2.py, CLIUrlSchemeTests): a server that answers nothing but
    `/api/v1/models` (no `/live`, no `/v1`) is a running server, reached under Lemonade's prefix, and
    `list` says it has no models; `LEMONADE_HOST` given as a URL, as people paste it."""
    root = tmp_path / "site"
    (root / "api" / "v1").mkdir(parents=True)
    (root / "api" / "v1" / "models").write_text('{"data": []}')
    with served_folder(root) as url:
        env = cli_env(tmp_path / "cache")
        env.pop("LEMONADE_BASE_URL", None)
        proc = ok(lemonade("list", env={**env, "LEMONADE_HOST": url}))
    assert "No models available" in proc.stdout


def test_https_base_url_without_a_server_names_the_next_step(tmp_path):
    """An https:// address nobody answers: the message says how to start a server, and that
    `lemonade serve` speaks http (so `run` does not start one that could never answer there)."""
    env = cli_env(tmp_path / "cache", f"https://127.0.0.1:{free_port()}/api/v1")
    for args in (["status"], ["run", "some-model"], ["chat", "some-model"]):
        proc = lemonade(*args, env=env)
        assert proc.returncode == 3, proc.stderr
        assert "https://" in proc.stderr and "http://" in proc.stderr.replace("https://", "")
    assert not (tmp_path / "cache" / "server.pid").exists()


def test_config_get_unknown_key(nowhere):
    proc = lemonade("config", "get", "nope.key", env=nowhere)
    assert proc.returncode == 2 and "nope.key" in proc.stderr


def test_backends_without_a_server_show_the_local_state(nowhere):
    proc = ok(lemonade("backends", env=nowhere))
    assert "No server running" in proc.stderr
    assert "llamacpp" in proc.stdout and "installable" in proc.stdout
    assert "lemonade backends install llamacpp:cpu" in proc.stdout
    rows = json.loads(ok(lemonade("backends", "--json", env=nowhere)).stdout)
    cpu = next(r for r in rows if (r["recipe"], r["backend"]) == ("llamacpp", "cpu"))
    assert cpu["state"] == "installable" and cpu["default"] is True
    assert {r["state"] for r in rows} <= {"installed", "installable", "update_required", "unsupported"}


@pytest.mark.parametrize("spec, code, text", [
    ("llamacpp", 2, "RECIPE:BACKEND"),
    (":cpu", 2, "RECIPE:BACKEND"),
    ("llamacpp:vulkan", 1, "vulkan"),
    ("nosuch:cpu", 2, "nosuch"),  # refused before asking anyone: exit 2
])
def test_backends_install_refuses_bad_specs(nowhere, spec, code, text):
    proc = lemonade("backends", "install", spec, env=nowhere)
    assert proc.returncode == code and text in proc.stderr
    assert not (Path(nowhere["LEMONADE_CACHE_DIR"]) / "backends" / "llamacpp" / "cpu").exists()


def test_backends_install_without_a_server_is_a_quick_noop_when_installed(nowhere, llama_backend):
    """The local path (no server) with the same progress display; never a real build here."""
    cache = Path(nowhere["LEMONADE_CACHE_DIR"])
    link = cache / "backends" / "llamacpp" / "cpu"
    link.parent.mkdir(parents=True)
    link.symlink_to(llama_backend, target_is_directory=True)
    proc = ok(lemonade("backends", "install", "llamacpp:cpu", env=nowhere, timeout=60))
    assert "no server running" in proc.stderr and "already installed" in proc.stderr
    version = json.loads((llama_backend / "install.json").read_text())["version"]
    assert f"llamacpp:cpu is installed (version {version})" in proc.stdout
    rows = json.loads(ok(lemonade("backends", "--json", env=nowhere)).stdout)
    assert next(r for r in rows if r["backend"] == "cpu")["state"] == "installed"


def test_backends_uninstall_without_a_server_when_not_installed(nowhere):
    proc = ok(lemonade("backends", "uninstall", "llamacpp:cpu", env=nowhere))
    assert "was not installed" in proc.stdout


def test_stop_without_a_server(nowhere):
    assert "No Lemonade server is running" in ok(lemonade("stop", env=nowhere)).stdout


# ----- against the Gemma server ------------------------------------------------------------------

def test_list_sections_and_downloaded_flag(env, gemma_server):
    """guide-cli.md: `list` shows Local and Available for Download; `--downloaded` only the first.
    Each row starts with the model's id and Yes/No (what scripts split on)."""
    with gemma_server.client() as c:
        everything = c.get("/v1/models", params={"show_all": "true"}).json()["data"]
        downloaded = c.get("/v1/models").json()["data"]
    lines = ok(lemonade("list", env=env)).stdout.splitlines()
    assert lines[0] == "Local" and "Available for Download" in lines
    split = lines.index("Available for Download")
    local_rows = [line for line in lines[:split] if line.split()[1:2] in (["Yes"], ["No"])]
    remote_rows = [line for line in lines[split:] if line.split()[1:2] in (["Yes"], ["No"])]
    assert [r.split()[0] for r in local_rows] == [m["id"] for m in downloaded]
    assert len(remote_rows) == len(everything) - len(downloaded) and all(r.split()[1] == "No" for r in remote_rows)
    row = next(line for line in local_rows if line.split()[0] == GEMMA_NAME)
    assert row.split()[1] == "Yes" and "llamacpp" in row and "custom" in row and "MB" in row
    assert any(r.split()[0] == "Qwen3-0.6B-GGUF" for r in remote_rows)
    local = ok(lemonade("list", "--downloaded", env=env)).stdout
    assert GEMMA_NAME in local and "Qwen3-0.6B-GGUF" not in local and "Available for Download" not in local
    listed = json.loads(ok(lemonade("list", "--json", env=env)).stdout)
    assert [m["id"] for m in listed] == [m["id"] for m in everything]
    only_local = json.loads(ok(lemonade("list", "--downloaded", "--json", env=env)).stdout)
    assert [m["id"] for m in only_local] == [m["id"] for m in downloaded]


def test_api_key_flag(make_server):
    srv = make_server(env={"LEMONADE_API_KEY": "sekret"})
    env = cli_env(srv.cache, srv.url)
    refused = lemonade("status", env=env)
    assert refused.returncode != 0 and "401" in refused.stderr + refused.stdout
    assert "running" in ok(lemonade("--api-key", "sekret", "status", env=env)).stdout
    wrong = lemonade("--api-key", "wrong", "status", env={**env, "LEMONADE_API_KEY": "sekret"})
    assert wrong.returncode != 0  # the flag wins over the environment


def test_status_load_unload(env, gemma_server):
    ok(lemonade("unload", env=env))
    proc = ok(lemonade("status", env=env))
    assert gemma_server.url in proc.stdout and "No models loaded" in proc.stdout
    proc = ok(lemonade("load", GEMMA_NAME, "--ctx-size", "2048", "--pinned", env=env))
    assert f"Loaded model: {GEMMA_NAME}" in proc.stdout
    with gemma_server.client() as c:
        health = c.get("/v1/health").json()
    [loaded] = health["all_models_loaded"]
    assert loaded["model_name"] == GEMMA_NAME and loaded["pinned"] is True
    assert loaded["recipe_options"]["ctx_size"] == 2048
    proc = ok(lemonade("status", env=env))
    row = next(line for line in proc.stdout.splitlines() if GEMMA_NAME in line and "llm" in line)  # the table's
    assert str(loaded["pid"]) in row and "llm" in row and "yes" in row  # pinned
    assert json.loads(ok(lemonade("status", "--json", env=env)).stdout)["all_models_loaded"][0]["pid"] == \
        loaded["pid"]
    ok(lemonade("load", GEMMA_NAME, "--unpinned", "--ctx-size", "2048", env=env))
    with gemma_server.client() as c:
        assert c.get("/v1/health").json()["all_models_loaded"][0]["pinned"] is False
    proc = ok(lemonade("unload", GEMMA_NAME, env=env))
    assert "unloaded" in proc.stdout.lower()
    with gemma_server.client() as c:
        assert c.get("/v1/health").json()["all_models_loaded"] == []
    assert not psutil.pid_exists(loaded["pid"]) or psutil.Process(loaded["pid"]).status() == psutil.STATUS_ZOMBIE
    proc = lemonade("unload", GEMMA_NAME, env=env)
    assert proc.returncode == 1 and "404" in proc.stderr and GEMMA_NAME in proc.stderr


def test_load_warns_when_every_slot_of_its_type_is_pinned(make_server, gemma_dir, tmp_path):
    """guide-configuration-multi-model.md, "Pre-emptive Warnings": `lemonade load` checks /v1/health
    first and says when the load will fail because every slot of the model's type is pinned. Two
    names for Gemma's file make two models competing for the one `llm` slot."""
    extra = tmp_path / "two"
    extra.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (extra / name).symlink_to(gemma_dir / f"{GEMMA_NAME}.gguf")
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(extra)})
    env = cli_env(tmp_path / "cli", srv.url)
    assert "Warning" not in ok(lemonade("load", "a", "--pinned", env=env)).stderr
    blocked = lemonade("load", "b", env=env)
    assert blocked.returncode != 0
    assert ("Warning: all 1 slot(s) for 'llm' models are occupied by pinned models (a), so loading b will fail. "
            "Free one first: lemonade unpin a") in blocked.stderr, blocked.stderr
    assert "pinned" in blocked.stderr.split("Warning", 1)[1].split("\n", 1)[1]  # and the server's refusal follows
    assert "Warning" not in ok(lemonade("load", "a", env=env)).stderr  # loaded already: it keeps its slot
    ok(lemonade("unpin", "a", env=env))
    assert "Warning" not in ok(lemonade("load", "b", env=env)).stderr


def test_load_refusals_come_from_the_server(env):
    proc = lemonade("load", "No-Such-Model-GGUF", env=env)
    assert proc.returncode == 1 and "No-Such-Model-GGUF" in proc.stderr and "404" in proc.stderr
    proc = lemonade("load", GEMMA_NAME, "--llamacpp-args", "--port 1", env=env)
    assert proc.returncode == 1 and "400" in proc.stderr and "--port" in proc.stderr


def test_alias_add_list_remove(env, gemma_server):
    proc = ok(lemonade("alias", "add", "cli-llm", GEMMA_NAME, env=env))
    assert f"cli-llm -> {GEMMA_NAME}" in proc.stdout
    row = next(line for line in ok(lemonade("alias", "list", env=env)).stdout.splitlines() if "cli-llm" in line)
    assert GEMMA_NAME in row and "llamacpp" in row and "yes" in row
    listed = json.loads(ok(lemonade("alias", "list", "--json", env=env)).stdout)
    with gemma_server.client() as c:
        assert listed == c.get("/internal/aliases").json()["aliases"]
        entry = c.get("/v1/models/cli-llm").json()  # an alias is a model entry of its own
        assert entry["id"] == "cli-llm" and entry["alias_target"] == GEMMA_NAME and entry["recipe"] == "llamacpp"
    assert "cli-llm" in ok(lemonade("list", env=env)).stdout  # and listed, copy-paste-able like every row
    proc = lemonade("alias", "add", "cli-bad", "No-Such-Model", env=env)
    assert proc.returncode == 1 and "No-Such-Model" in proc.stderr
    ok(lemonade("alias", "remove", "cli-llm", env=env))
    assert "cli-llm" not in ok(lemonade("alias", "list", env=env)).stdout
    proc = lemonade("alias", "remove", "cli-llm", env=env)
    assert proc.returncode == 1 and "cli-llm" in proc.stderr


def test_backends_through_the_server(env, gemma_server):
    rows = json.loads(ok(lemonade("backends", "--all", "--json", env=env)).stdout)
    with gemma_server.client() as c:
        recipes = c.get("/v1/system-info").json()["recipes"]
    for row in rows:
        expected = recipes[row["recipe"]]["backends"][row["backend"]]
        assert row["state"] == expected["state"] and row.get("version") == expected.get("version")
    assert len(rows) == sum(len(r["backends"]) for r in recipes.values())
    table = ok(lemonade("backends", env=env)).stdout
    cpu = next(line for line in table.splitlines() if "cpu (default)" in line)
    assert "installed" in cpu and recipes["llamacpp"]["backends"]["cpu"]["version"] in cpu
    assert "No server running" not in ok(lemonade("backends", env=env)).stderr
    proc = ok(lemonade("backends", "install", "llamacpp:cpu", env=env, timeout=60))  # SSE path, no-op
    assert "through the server" in proc.stderr and "already installed" in proc.stderr
    assert "llamacpp:cpu is installed" in proc.stdout


# ----- `chat`: the conversation, driven through stdin ----------------------------------------------

def _stats(server, requests: int = 0) -> dict:
    """`/v1/stats` once it has counted `requests` requests (the server records a stream's figures just
    after the client has seen its end, so the CLI can exit a moment before they are in)."""
    deadline = time.monotonic() + 30
    with server.client() as c:
        while True:
            stats = c.get("/v1/stats").json()
            if stats["request_count_total"] >= requests or time.monotonic() > deadline:
                return stats
            time.sleep(0.05)


def test_chat_chats_with_piped_stdin(env, gemma_server):
    before = _stats(gemma_server)["request_count_total"]
    proc = ok(lemonade("chat", GEMMA_NAME, "--max-tokens", "12", "--temperature", "0", env=env,
                       stdin="Hello! What is your name?\n"))
    assert proc.stdout.strip(), proc.stderr  # the model's reply, streamed to stdout
    assert "Chatting with" not in proc.stdout  # status goes to stderr, stdout holds only the reply
    with gemma_server.client() as c:
        assert c.get("/v1/health").json()["model_loaded"] == GEMMA_NAME
    assert _stats(gemma_server, before + 1)["output_tokens"] > 0  # (also: the next tests count from here)


def test_chat_with_host_and_port(gemma_server, tmp_path):
    """`lemonade chat MODEL --host H --port P` talks to that server (no LEMONADE_BASE_URL set)."""
    env = cli_env(tmp_path / "cache")
    url = httpx.URL(gemma_server.url)
    proc = ok(lemonade("chat", GEMMA_NAME, "--host", url.host, "--port", str(url.port), "--no-start",
                       "--max-tokens", "4", "--temperature", "0", env=env, stdin="Hello\n"))
    assert proc.stdout.strip(), proc.stderr
    proc = lemonade("chat", GEMMA_NAME, "--host", "127.0.0.1", "--port", str(free_port()), "--no-start", env=env)
    assert proc.returncode == 3 and NO_SERVER in proc.stderr


def test_chat_keeps_history_and_clear_resets_it(env, gemma_server):
    """Prompt sizes seen by the engine: turn 2 carries turn 1 unless /clear came in between."""
    question = "Name a color.\n"
    count = _stats(gemma_server)["request_count_total"]
    ok(lemonade("chat", GEMMA_NAME, "--max-tokens", "6", env=env, stdin=question))
    single = _stats(gemma_server, count + 1)["prompt_tokens"]
    assert single and single > 0
    ok(lemonade("chat", GEMMA_NAME, "--max-tokens", "6", env=env, stdin=question + "/clear\n" + question))
    assert _stats(gemma_server, count + 3)["prompt_tokens"] == single
    ok(lemonade("chat", GEMMA_NAME, "--max-tokens", "6", env=env, stdin=question + question))
    assert _stats(gemma_server, count + 5)["prompt_tokens"] > single


def test_chat_exit_stops_reading(env, gemma_server):
    before = _stats(gemma_server)["request_count_total"]
    ok(lemonade("chat", GEMMA_NAME, "--max-tokens", "4", env=env, stdin="Hi\n\n/exit\nThis is never sent\n"))
    assert _stats(gemma_server, before + 1)["request_count_total"] == before + 1


def test_chat_reports_refused_turns_and_exits_non_zero(env, gemma_server):
    before = _stats(gemma_server)["request_count_total"]
    proc = lemonade("chat", GEMMA_NAME, "--temperature", "5", env=env, stdin="Hi\nHello\n")
    assert proc.returncode == 1
    assert proc.stderr.count("Error 400") == 2 and "temperature" in proc.stderr  # the chat went on
    assert _stats(gemma_server)["request_count_total"] == before  # refused before reaching the engine


def test_chat_unknown_model(env):
    proc = lemonade("chat", "No-Such-Model-GGUF", env=env, stdin="hi\n")
    assert proc.returncode == 1 and "No-Such-Model-GGUF" in proc.stderr and proc.stdout == ""


def _kill_tree(pid: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        proc = psutil.Process(pid)
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        proc.kill()


def test_chat_starts_a_server_in_the_background_and_stop_ends_it(tmp_path, llama_backend, gemma_dir):
    """The quick-start path: config on disk, then `chat` with no server up, then `lemonade stop`."""
    cache = tmp_path / "cache"
    link = cache / "backends" / "llamacpp" / "cpu"
    link.parent.mkdir(parents=True)
    link.symlink_to(llama_backend, target_is_directory=True)
    env = cli_env(cache, f"http://127.0.0.1:{free_port()}")
    ok(lemonade("config", "set", f"extra_models_dir={gemma_dir}", env=env))
    server_pid = None
    engines: list[int] = []
    try:
        # greedy: at the default temperature, 8 sampled tokens of the 270M model were once all blanks
        proc = lemonade("chat", GEMMA_NAME, "--max-tokens", "8", "--temperature", "0", env=env, stdin="Hello!\n")
        with contextlib.suppress(OSError, ValueError):
            server_pid = json.loads((cache / "server.pid").read_text())["pid"]
        ok(proc)
        assert proc.stdout.strip(), proc.stdout
        assert "Started a Lemonade server in the background" in proc.stderr and "lemonade stop" in proc.stderr
        assert server_pid and psutil.pid_exists(server_pid)
        assert (cache / "server.log").is_file()
        health = httpx.get(env["LEMONADE_BASE_URL"] + "/v1/health", timeout=10).json()
        engines = [m["pid"] for m in health["all_models_loaded"]]
        assert health["all_models_loaded"][0]["model_name"] == GEMMA_NAME
        # a second `chat` reuses the running server and the loaded model
        again = ok(lemonade("chat", GEMMA_NAME, "--max-tokens", "4", env=env, stdin="Hi\n"))
        assert "Started" not in again.stderr and "Loading" not in again.stderr
        proc = ok(lemonade("stop", env=env, timeout=60))
        assert f"Stopped the Lemonade server (pid {server_pid})" in proc.stdout
        assert not psutil.pid_exists(server_pid)
        assert not any(psutil.pid_exists(pid) for pid in engines)
        assert not (cache / "server.pid").exists()
        assert lemonade("status", env=env).returncode == 3
    finally:
        for pid in [*engines, server_pid]:
            if pid:
                _kill_tree(pid)


# ----- config through a running server -----------------------------------------------------------

def test_config_through_the_server(make_server, tmp_path):
    server = make_server()
    env = cli_env(server.cache, server.url)
    proc = ok(lemonade("config", "set", "llamacpp.args=--slot-save-path /x", "max_loaded_models=2", env=env))
    assert "No server running" not in proc.stderr
    with server.client() as c:
        live = c.get("/internal/config").json()
        assert live["max_loaded_models"] == 2 and live["llamacpp"]["args"] == "--slot-save-path /x"
        assert c.get("/v1/health").json()["max_models"]["llm"] == 2  # applied live
    saved = json.loads((server.config_dir / "config.json").read_text())
    assert saved["max_loaded_models"] == 2 and saved["llamacpp"]["args"] == "--slot-save-path /x"
    assert ok(lemonade("config", "get", "max_loaded_models", env=env)).stdout.strip() == "2"
    before = (server.config_dir / "config.json").read_bytes()
    proc = lemonade("config", "set", "max_loaded_models=3", "nope=1", env=env)
    assert proc.returncode == 2 and "'nope'" in proc.stderr
    assert (server.config_dir / "config.json").read_bytes() == before
    with server.client() as c:
        assert c.get("/internal/config").json()["max_loaded_models"] == 2


def test_config_through_a_server_with_an_admin_key(make_server):
    server = make_server(env={"LEMONADE_ADMIN_API_KEY": "admin-secret"})
    env = cli_env(server.cache, server.url)
    path = server.config_dir / "config.json"
    before = path.read_bytes() if path.exists() else None
    proc = lemonade("config", "set", "max_loaded_models=4", env=env)
    assert proc.returncode == 1 and "401" in proc.stderr
    assert (path.read_bytes() if path.exists() else None) == before
    env["LEMONADE_ADMIN_API_KEY"] = "admin-secret"
    ok(lemonade("config", "set", "max_loaded_models=4", env=env))
    assert ok(lemonade("config", "get", "max_loaded_models", env=env)).stdout.strip() == "4"


def test_backends_uninstall_through_the_server(make_server, tmp_path, llama_backend):
    """A real uninstall of a private copy of the backend (the shared build is never touched)."""
    cache = tmp_path / "own-cache"
    shutil.copytree(llama_backend, cache / "backends" / "llamacpp" / "cpu")
    server = make_server(cache=cache)
    env = cli_env(cache, server.url)
    proc = ok(lemonade("backends", "uninstall", "llamacpp:cpu", env=env))
    assert "Uninstalled llamacpp:cpu" in proc.stdout
    assert not (cache / "backends" / "llamacpp" / "cpu").exists()
    assert (llama_backend / "install.json").is_file()
    rows = json.loads(ok(lemonade("backends", "--json", env=env)).stdout)
    assert next(r for r in rows if r["backend"] == "cpu")["state"] == "installable"


@pytest.mark.parametrize("args", [["pull", "No-Such-Model-GGUF"], ["delete", "No-Such-Model-GGUF"],
                                  ["check-updates"], ["export", GEMMA_NAME, "-o", "-"], ["import", "{file}"]])
def test_model_commands_use_the_configured_port(gemma_server, tmp_path, args):
    """`port` in config.json is where these commands look for the server (no flags, no env)."""
    cache = tmp_path / "cache"
    config_dir_of(cache).mkdir()
    (config_dir_of(cache) / "config.json").write_text(json.dumps({"port": gemma_server.port}))
    exported = tmp_path / "exported.json"
    exported.write_text(json.dumps({"model_name": "No-Such-Model-GGUF", "recipe": "llamacpp",
                                    "checkpoint": "no-such-org/No-Such-Model-GGUF:Q4_0"}))
    proc = lemonade(*[a.replace("{file}", str(exported)) for a in args], env=cli_env(cache))
    assert NO_SERVER not in proc.stderr, proc.stderr  # it reached the configured server
    if args[0] == "export":  # the server said what the model is: a file of its extra models dir
        assert proc.returncode == 1 and "extra models dir" in proc.stderr, proc.stderr
    elif args[0] != "check-updates":  # (offline-free servers may answer either way; reaching it is the point)
        assert proc.returncode != 0 and "No-Such-Model-GGUF" in proc.stderr, proc.stderr


# ----- pinning and what health shows ----------------------------------------------------------------

def test_pin_unpin_survives_a_crash_and_launch_command_paths_are_for_admins(make_server, gemma_dir):
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir), "LEMONADE_API_KEY": "user",
                           "LEMONADE_ADMIN_API_KEY": "admin"})
    env = cli_env(srv.cache, srv.url, LEMONADE_ADMIN_API_KEY="admin")
    user, admin = {"Authorization": "Bearer user"}, {"Authorization": "Bearer admin"}

    def loaded(headers: dict[str, str]) -> dict:
        with srv.client(headers=headers) as c:
            return c.get("/v1/health").json()["all_models_loaded"][0]

    with srv.client(headers=admin) as c:
        gone = c.post("/internal/pin", json={"model_name": GEMMA_NAME, "pinned": True})
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_loaded"
        assert c.post("/internal/pin", json={"model_name": GEMMA_NAME, "pinned": "yes"}).status_code == 400
        assert c.post("/v1/load", json={"model_name": GEMMA_NAME}).status_code == 200
    with srv.client(headers=user) as c:
        assert c.post("/internal/pin", json={"model_name": GEMMA_NAME, "pinned": True}).status_code == 401  # admin
    assert "Pinned" in ok(lemonade("pin", GEMMA_NAME, env=env)).stdout
    assert loaded(user)["pinned"] is True
    # An engine that dies keeps its pin when the next request starts it again.
    os.kill(loaded(admin)["pid"], signal.SIGKILL)
    with srv.client(headers=user) as c:
        for _ in range(100):
            if not c.get("/v1/health").json()["all_models_loaded"]:
                break
            time.sleep(0.1)
        chat = c.post("/v1/chat/completions", json={"model": GEMMA_NAME, "max_tokens": 2,
                                                    "messages": [{"role": "user", "content": "Hi"}]})
        assert chat.status_code == 200, chat.text
    assert loaded(user)["pinned"] is True
    assert "Unpinned" in ok(lemonade("unpin", GEMMA_NAME, env=env)).stdout
    assert loaded(user)["pinned"] is False
    # launch_command is the argv; only an admin sees this machine's paths in it.
    for_admin, for_user = loaded(admin)["launch_command"], loaded(user)["launch_command"]
    assert for_admin[0].endswith("llama-server") and str(srv.cache) in for_admin[0] and "--port" in for_admin
    assert for_user[0].startswith("<cache>/") and not any(str(srv.cache) in arg for arg in for_user)
    assert len(for_user) == len(for_admin)
