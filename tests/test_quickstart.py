"""The quick start's guards: it never uses a server of another installation, and `lemonade chat`
stops a reply that only repeats itself. (The whole quick start, as a new user runs it on a fresh
machine, is `.ci/newuser`, which CI runs before the tests.)"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from lemonade.cli.chat import runaway
from tests.helpers import GEMMA_NAME, cli_env, config_dir_of

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, stopped", [
    ("Hello! " + "#" * 100, True),
    ("I am fine.\n" * 12, True),
    ("Hello there. " * 3, False),
    ("| a | b |\n| --- | --- |\n| 1 | 2 |\n", False),
    ("-" * 60, False),
    ("A normal, longer answer that talks about several things without looping at all. " * 1, False),
])
def test_runaway_replies_are_recognised(text, stopped):
    assert runaway(text) is stopped


def _check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = ("import sys, typer\n"
            "from lemonade.cli.background import check_server_is_ours\n"
            "from lemonade.cli.common import client\n"
            "try:\n    print(check_server_is_ours(client()))\n"
            "except typer.Exit as exc:\n    sys.exit(exc.exit_code)\n")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_server_of_this_installation_is_recognised(gemma_server):
    env = cli_env(gemma_server.cache, LEMONADE_PORT=str(gemma_server.port))
    proc = _check(env)
    assert proc.returncode == 0, proc.stderr
    assert f"Lemonade server at {gemma_server.url}" in proc.stdout and str(gemma_server.cache) in proc.stdout


def test_nothing_running_is_no_server(tmp_path):
    from tests.helpers import free_port

    proc = _check(cli_env(tmp_path, LEMONADE_PORT=str(free_port())))
    assert proc.returncode == 0 and proc.stdout.strip() == "None"


def test_quickstart_refuses_a_server_of_another_installation(gemma_server, tmp_path):
    """A server on the port with another cache dir: the quick start names it and stops before it
    installs anything into it or chats through it."""
    mine = tmp_path / "my-cache"
    env = cli_env(mine, LEMONADE_PORT=str(gemma_server.port), LEMONADE_VENV=sys.prefix)
    # The venv running the tests has this package installed: stamped so, the script does not
    # `pip install -e` it again (which would point the venv at ROOT when the tests run from another clone).
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    (Path(sys.prefix) / ".lemonade-quickstart").write_text(digest + "\n")
    with gemma_server.client() as c:
        before = c.get("/v1/health").json()["all_models_loaded"]
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "quickstart.sh")], env=env, input="Hello\n",
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""  # no chat happened
    assert f"The Lemonade server at {gemma_server.url}" in proc.stderr
    assert str(gemma_server.cache) in proc.stderr and "LEMONADE_PORT=" in proc.stderr
    assert "Checking the llama.cpp engine" not in proc.stderr
    with gemma_server.client() as c:
        assert c.get("/v1/health").json()["all_models_loaded"] == before
    assert not (config_dir_of(mine) / "config.json").exists()  # nothing was configured either


def test_transcript_of_a_conversation():
    from lemonade.cli.chat import BASE_PREAMBLE, transcript

    text = transcript([{"role": "user", "content": "Hi "}, {"role": "assistant", "content": "Hello!"},
                       {"role": "user", "content": "Who are you?"}])
    assert text.startswith(BASE_PREAMBLE + "\n\nUser: Good morning!\n")
    assert text.endswith("\nUser: Hi\nAssistant: Hello!\nUser: Who are you?\nAssistant:")
    assert transcript([{"role": "system", "content": "Be terse."}]).startswith("Be terse.\n\n")


def test_chat_base_talks_to_a_base_model_through_a_transcript(gemma_server, tmp_path):
    """The quick start's first contact: Gemma 3 270M (a base model) answers a question in one short
    paragraph of words, through /v1/completions with the transcript's stops."""
    import re

    from tests.helpers import lemonade, ok

    def completions_served() -> float:
        with gemma_server.client() as c:
            metrics = c.get("/metrics").text
        line = f'lemonade_model_requests_total{{endpoint="completions",model="{GEMMA_NAME}"}}'
        return next((float(x.split()[-1]) for x in metrics.splitlines() if x.startswith(line)), 0.0)

    before = completions_served()
    env = cli_env(tmp_path / "cache", gemma_server.url)
    proc = ok(lemonade("chat", GEMMA_NAME, "--base", env=env, stdin="What is the capital of France?\n"))
    reply = proc.stdout.strip()
    assert re.search(r"[A-Za-z]{2,}", reply), reply  # a sampled reply: "Paris." is as good as a sentence
    assert "\n\n" not in reply and "User:" not in reply and len(reply) < 1500, reply
    assert completions_served() == before + 1
