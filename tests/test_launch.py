"""Issue 16, `lemonade launch AGENT`: the agent is started pointed at this server with a chat model.

The agents are stand-ins: small executables named `claude`, `codex`, `opencode` and `pi`, first on
PATH, that record the arguments and environment they were started with (and the config files the
launcher wrote) and exit with a code of their choosing. The server and its model (Gemma 3 270M)
are real; the launcher is the real CLI in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import GEMMA_NAME

STAND_IN = """#!{python}
import json, os, sys
with open(os.environ["AGENT_RECORD"], "w") as f:
    json.dump({{"argv": sys.argv, "env": dict(os.environ)}}, f)
sys.exit(int(os.environ.get("AGENT_EXIT", "0")))
"""


@pytest.fixture(scope="module")
def server(module_servers, gemma_dir):
    return module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})


@pytest.fixture(scope="module")
def bindir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("agents-bin")
    for name in ("claude", "codex", "opencode", "pi"):
        path = folder / name
        path.write_text(STAND_IN.format(python=sys.executable))
        path.chmod(0o755)
    return folder


def launch(server, bindir: Path, home: Path, *args: str, path: str | None = None, stdin: str | None = None,
           **extra: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    record = home / "record.json"
    record.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMONADE_", "HF_", "ANTHROPIC_", "OPENAI_"))}
    env.update({"LEMONADE_BASE_URL": server.url, "LEMONADE_CACHE_DIR": str(home / "cache"), "HOME": str(home),
                "PATH": path if path is not None else f"{bindir}{os.pathsep}{env['PATH']}",
                "AGENT_RECORD": str(record), "COLUMNS": "250", **extra})
    env.pop("XDG_CONFIG_HOME", None)
    proc = subprocess.run([sys.executable, "-m", "lemonade.cli.main", "launch", *args], env=env,
                          capture_output=True, text=True, timeout=300, input=stdin,
                          stdin=subprocess.DEVNULL if stdin is None else None)
    return proc, (json.loads(record.read_text()) if record.exists() else {})


def loaded(server) -> set[str]:
    return {m["model_name"] for m in httpx.get(server.url + "/v1/health").json()["all_models_loaded"]}


def test_claude_gets_the_server_the_model_and_a_key(server, bindir, tmp_path):
    assert GEMMA_NAME not in loaded(server)
    proc, seen = launch(server, bindir, tmp_path, "claude", "--model", GEMMA_NAME, "--agent-args",
                        "--resume 'my session'", AGENT_EXIT="7")
    assert proc.returncode == 7, proc.stderr  # the agent's own exit code
    env = seen["env"]
    assert env["ANTHROPIC_BASE_URL"] == server.url  # Claude Code adds /v1/messages itself
    assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_DEFAULT_SONNET_MODEL"] == env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] \
        == GEMMA_NAME
    assert env["ANTHROPIC_AUTH_TOKEN"] == "lemonade"  # the server has no key: any is accepted
    assert seen["argv"][1:] == ["--resume", "my session"]
    # It said what it did, and the model was loaded in the background while the agent ran.
    assert f"Launching claude with model {GEMMA_NAME} (as asked (--model); loading in the background)" in \
        " ".join(proc.stderr.split())
    assert "ANTHROPIC_BASE_URL=" + server.url in proc.stderr
    deadline = time.monotonic() + 120
    while GEMMA_NAME not in loaded(server) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert GEMMA_NAME in loaded(server)


def test_a_wildcard_host_reaches_the_agent_as_localhost(server, bindir, tmp_path):
    """`--host 0.0.0.0` (the address a server listens on, not one to connect to): the agent is given
    http://localhost:PORT, as Lemonade's launch writes it; the CLI itself connects to 127.0.0.1."""
    proc, seen = launch(server, bindir, tmp_path, "claude", "--model", GEMMA_NAME, "--host", "0.0.0.0",
                        "--port", str(server.port))
    assert proc.returncode == 0, proc.stderr
    assert seen["env"]["ANTHROPIC_BASE_URL"] == f"http://localhost:{server.port}"


def test_the_loaded_model_is_chosen_and_a_key_is_passed_on(server, bindir, tmp_path):
    proc, seen = launch(server, bindir, tmp_path, "codex", LEMONADE_API_KEY="")
    assert proc.returncode == 0, proc.stderr
    assert "the chat model already loaded; already loaded" in " ".join(proc.stderr.split())
    argv = seen["argv"]
    assert argv[argv.index("-m") + 1] == GEMMA_NAME
    assert f"base_url='{server.url}/v1'" in " ".join(argv) and 'model_provider="lemonade"' in argv
    assert seen["env"]["OPENAI_API_KEY"] == "lemonade"
    # A key of the user's (--api-key) reaches the agent, and is masked in what is printed.
    proc, seen = launch(server, bindir, tmp_path, "claude", path=None, LEMONADE_API_KEY="sekret-123")
    assert proc.returncode == 0 and seen["env"]["ANTHROPIC_AUTH_TOKEN"] == "sekret-123"
    assert "sekret-123" not in proc.stderr and "ANTHROPIC_AUTH_TOKEN=<api key>" in proc.stderr


def test_opencode_and_pi_config_files(server, bindir, tmp_path):
    config = tmp_path / ".config" / "opencode" / "opencode.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"theme": "dark", "provider": {"other": {"name": "kept"}}}))
    proc, seen = launch(server, bindir, tmp_path, "opencode", "--model", GEMMA_NAME)
    assert proc.returncode == 0, proc.stderr
    assert seen["argv"][1:] == ["-m", f"Lemonade/{GEMMA_NAME}"]
    written = json.loads(config.read_text())
    assert written["theme"] == "dark" and written["provider"]["other"] == {"name": "kept"}
    assert written["$schema"] == "https://opencode.ai/config.json"  # added to a file that had none
    ours = written["provider"]["Lemonade"]
    assert ours["options"]["baseURL"] == server.url + "/v1" and GEMMA_NAME in ours["models"]
    proc, seen = launch(server, bindir, tmp_path, "pi", "--model", GEMMA_NAME)
    assert proc.returncode == 0 and seen["argv"][1:] == ["--provider", "Lemonade", "--model", GEMMA_NAME]
    models = json.loads((tmp_path / ".pi" / "agent" / "models.json").read_text())
    assert models["providers"]["Lemonade"]["baseUrl"] == server.url + "/v1"
    config.write_text("{not json")
    proc, _ = launch(server, bindir, tmp_path, "opencode", "--model", GEMMA_NAME)
    assert proc.returncode == 1 and "is not valid JSON" in proc.stderr and config.read_text() == "{not json"


def test_refusals(server, bindir, tmp_path):
    proc, seen = launch(server, bindir, tmp_path, "gemini")
    assert proc.returncode == 2 and "Known agents: claude, codex, opencode, pi" in proc.stderr and not seen
    proc, _ = launch(server, bindir, tmp_path, "claude", path=str(tmp_path / "empty"))
    assert proc.returncode == 1 and "'claude' was not found on PATH" in proc.stderr and "npm" in proc.stderr
    proc, _ = launch(server, bindir, tmp_path, "claude", "--model", "no-such-model")
    assert proc.returncode == 1 and "no-such-model" in proc.stderr
    proc, _ = launch(server, bindir, tmp_path, "claude", "--provider", "x")
    assert proc.returncode == 2 and "--provider is only supported for 'lemonade launch codex'." in proc.stderr


def test_launch_options_as_the_guide_gives_them(server, bindir, tmp_path):
    """No agent named: it is asked for (a number or a name, also from a pipe); `-p` alone is the
    provider named lemonade of the user's Codex config (nothing injected), `--provider NAME` that one;
    `--api-key` after the command reaches the agent; --directory/--recipe-file give way to --model."""
    proc, seen = launch(server, bindir, tmp_path, "--model", GEMMA_NAME, stdin="1\n")
    assert proc.returncode == 0, proc.stderr
    assert "Select an agent to launch" in proc.stderr and "Selected agent: claude" in proc.stderr
    assert Path(seen["argv"][0]).name == "claude"
    proc, seen = launch(server, bindir, tmp_path, "--model", GEMMA_NAME, stdin="pi\n")
    assert proc.returncode == 0 and Path(seen["argv"][0]).name == "pi"
    proc, seen = launch(server, bindir, tmp_path, "--model", GEMMA_NAME, stdin="gemini\n")
    assert proc.returncode == 2 and "Unknown agent 'gemini'" in proc.stderr and not seen
    for extra, provider in ((["-p"], "lemonade"), (["--provider"], "lemonade"),
                            (["--provider", "custom-provider"], "custom-provider")):
        proc, seen = launch(server, bindir, tmp_path, "codex", "--model", GEMMA_NAME, *extra)
        assert proc.returncode == 0, proc.stderr
        assert f'model_provider="{provider}"' in seen["argv"]
        assert not any(a.startswith("model_providers.") for a in seen["argv"])  # the user's config has it
    proc, seen = launch(server, bindir, tmp_path, "claude", "--model", GEMMA_NAME, "--api-key", "test-api-key")
    assert proc.returncode == 0 and seen["env"]["ANTHROPIC_AUTH_TOKEN"] == "test-api-key"
    assert "Model was provided explicitly; skipping recipe import prompts." in proc.stderr  # said for any --model
    assert seen["env"]["CLAUDE_CODE_SUBAGENT_MODEL"] == GEMMA_NAME
    proc, _ = launch(server, bindir, tmp_path, "claude", "--model", GEMMA_NAME, "--directory", "coding-agents",
                     "--recipe-file", "dummy.json", path=str(tmp_path / "empty"))
    assert proc.returncode == 1
    assert "Model was provided explicitly; skipping recipe import prompts." in proc.stderr
    assert "Agent binary not found" in proc.stderr
    proc, _ = launch(server, bindir, tmp_path, "claude", "--model", GEMMA_NAME, "--provider")
    assert proc.returncode == 2 and "--provider is only supported for 'lemonade launch codex'." in proc.stderr
