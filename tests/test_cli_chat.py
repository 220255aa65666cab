"""`lemonade run` and `lemonade chat` with a real model (Gemma 3 270M on llama.cpp): guide-cli.md
"Options for run" and guide-cli-chat.md, the real CLI in a subprocess against a real server.

`run` loads the model and opens the web app (a recording BROWSER command sees the URL); `chat`
is driven through a pipe (one message a line, slash commands) and, for what only a terminal has
(the `>` prompt, Ctrl-C stopping a reply and leaving at an empty prompt), through a pseudo-terminal.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import GEMMA_NAME
from tests.test_cli import cli_env, lemonade, ok
from tests.test_webapp import recording_browser


@pytest.fixture(scope="module")
def env(gemma_server, tmp_path_factory) -> dict[str, str]:
    return cli_env(tmp_path_factory.mktemp("chat-cli-cache"), gemma_server.url)


def health(server) -> dict:
    with server.client() as c:
        return c.get("/v1/health").json()


# ----- run: load, then the web app -----------------------------------------------------------------

def test_run_loads_the_model_and_opens_the_web_app(env, gemma_server, tmp_path):
    browser, urls = recording_browser(tmp_path)
    ok(lemonade("unload", env=env))
    proc = ok(lemonade("run", GEMMA_NAME, "--ctx-size", "2048", "--save-options", env={**env, **browser}))
    assert urls.read_text().splitlines() == [gemma_server.url + "/#/chat"]
    assert f"Opened {gemma_server.url}/#/chat" in proc.stdout and f"lemonade chat {GEMMA_NAME}" in proc.stderr
    [loaded] = health(gemma_server)["all_models_loaded"]
    assert loaded["model_name"] == GEMMA_NAME and loaded["recipe_options"]["ctx_size"] == 2048
    with gemma_server.client() as c:
        assert c.get(f"/v1/models/{GEMMA_NAME}/options").json()["saved"]["ctx_size"] == 2048
    # global options before the command, no address in the environment; a loaded model is used as it is
    bare = {k: v for k, v in env.items() if k != "LEMONADE_BASE_URL"}
    url = httpx.URL(gemma_server.url)
    proc = ok(lemonade("--host", str(url.host), "--port", str(url.port), "run", GEMMA_NAME, env={**bare, **browser}))
    assert "Loading" not in proc.stderr and urls.read_text().splitlines()[-1] == gemma_server.url + "/#/chat"
    assert health(gemma_server)["all_models_loaded"][0]["pid"] == loaded["pid"]
    proc = lemonade("run", GEMMA_NAME, "--system", "x", env={**env, **browser})
    assert proc.returncode == 2 and "--chat-cli" in proc.stderr
    with gemma_server.client() as c:  # leave no saved options behind for the other tests
        c.post(f"/v1/models/{GEMMA_NAME}/options", json={"options": {}})


def test_run_chat_cli_is_the_terminal_chat(env, gemma_server):
    proc = ok(lemonade("run", GEMMA_NAME, "--chat-cli", "--max-tokens", "8", env=env, stdin="Hello!\n"))
    assert proc.stdout.strip() and "Opened" not in proc.stdout


# ----- chat through a pipe -------------------------------------------------------------------------

def test_chat_uses_the_loaded_model_and_takes_slash_commands(env, gemma_server):
    ok(lemonade("load", GEMMA_NAME, env=env))
    script = "\n".join(["/help", "/stats", "/think off", "/think", "Hello there!", "/stats", "/ps", "/list",
                        "/list --all --downloaded", "/list --bogus", "/model No-Such-Model-GGUF",
                        "/system Answer in one word.", "What colour is the sky?", "/nonsense", "/exit",
                        "never sent"]) + "\n"
    proc = ok(lemonade("chat", "--max-tokens", "10", env=env, stdin=script))
    err = proc.stderr
    assert "Slash commands" in err and "/think [on|off|default]" in err and "/multiline" in err
    assert "No reply yet." in err
    assert "Reasoning: off (thinking traces suppressed)." in err
    assert " tokens · " in err and " tok/s · " in err and " prompt" in err  # /stats after a reply
    assert f"{GEMMA_NAME}  (active, llm, llamacpp" in err  # /ps
    assert f"● {GEMMA_NAME}  (loaded, active, llamacpp)" in err  # /list
    assert "Unknown option: --bogus" in err
    assert "404" in err and "No-Such-Model-GGUF" in err  # /model: the server's answer; the chat went on
    assert "System prompt set; conversation cleared." in err
    assert "Unknown command: /nonsense (try /help)" in err
    assert len([line for line in proc.stdout.splitlines() if line.strip()]) >= 2  # two replies, nothing else
    assert "Slash commands" not in proc.stdout


def test_chat_no_stream_and_system(env, gemma_server):
    proc = ok(lemonade("chat", GEMMA_NAME, "--no-stream", "--system", "You are terse.", "--max-tokens", "8",
                       env=env, stdin="Hi\n"))
    assert proc.stdout.strip(), proc.stderr


def test_chat_reasoning_is_shown_above_the_answer_and_not_sent_back(make_server, gemma_dir, tmp_path):
    """A chat template that opens the assistant's turn with <think> makes llama-server return what the
    model writes before </think> as reasoning_content: shown (on stderr, dimmed on a terminal), kept
    out of stdout and of the history sent back next turn."""
    template = tmp_path / "think.jinja"
    template.write_text("{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else "
                        "m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
                        "{% if add_generation_prompt %}<start_of_turn>model\n<think>\n{% endif %}")
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir),
                           # the template is the point of this test; reasoning parsed the deepseek way
                           "LEMONADE_LLAMACPP_ARGS": f"--chat-template-file {template} --reasoning-format deepseek"})
    env = cli_env(tmp_path / "cache", srv.url)
    with srv.client() as c:
        body = c.post("/v1/chat/completions", json={"model": GEMMA_NAME, "max_tokens": 24, "seed": 1,
                                                    "messages": [{"role": "user", "content": "Hi"}]}).json()
    message = body["choices"][0]["message"]
    assert message.get("reasoning_content"), message  # what the engine does with this template
    proc = ok(lemonade("chat", GEMMA_NAME, "--max-tokens", "24", env=env, stdin="Hi\nAnd then?\n"))
    assert "thinking…" in proc.stderr
    assert message["reasoning_content"].strip()[:10] in proc.stderr or proc.stderr.count("thinking…") == 2
    assert "thinking" not in proc.stdout
    log = srv.log()
    assert "reasoning_content" not in log  # (nothing to check there; the history is checked below)
    ok(lemonade("chat", GEMMA_NAME, "--no-stream", "--max-tokens", "24", env=env, stdin="Hi\n"))


# ----- chat on a terminal --------------------------------------------------------------------------

class Terminal:
    """`lemonade chat` on a pseudo-terminal: what a user sees and types."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        import pty

        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen([sys.executable, "-m", "lemonade.cli.main", *args], stdin=slave, stdout=slave,
                                     stderr=slave, env={**env, "TERM": "xterm", "COLUMNS": "100"},
                                     start_new_session=True)
        os.close(slave)
        self.seen = ""

    def read_until(self, text: str, timeout: float = 120) -> str:
        """Output until `text` appears (after what was already read); AssertionError naming it otherwise."""
        start = len(self.seen)
        deadline = time.monotonic() + timeout
        while text not in self.seen[start:]:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} not seen; output:\n{self.seen[-3000:]}"
            ready, _, _ = select.select([self.master], [], [], min(left, 1.0))
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # the child closed the terminal
                    chunk = b""
                if not chunk:
                    assert text in self.seen[start:], f"{text!r} not seen before exit; output:\n{self.seen[-3000:]}"
                    break
                self.seen += chunk.decode(errors="replace")
        return self.seen[start:]

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            os.close(self.master)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        try:
            os.close(self.master)
        except OSError:
            pass


@pytest.fixture
def terminal(env) -> Iterator[type[Terminal]]:
    opened: list[Terminal] = []

    def open_(*args: str) -> Terminal:
        t = Terminal(list(args), env)
        opened.append(t)
        return t

    yield open_  # type: ignore[misc]
    for t in opened:
        t.close()


def test_ctrl_c_stops_a_reply_and_returns_to_the_prompt(terminal, gemma_server):
    """Ctrl-C while the model writes closes the stream (the engine stops generating) and gives the
    prompt back; Ctrl-C at an empty prompt leaves."""
    t = terminal("chat", GEMMA_NAME, "--max-tokens", "3000", "--temperature", "1.0")
    t.read_until("Stop response or exit: Ctrl-C")
    t.read_until("> ")
    t.type("Write a very long story about a lemon tree, with many chapters.\r")
    t.read_until("\n", timeout=60)  # the line typed
    deadline = time.monotonic() + 120
    while not any(m.get("is_streaming") for m in health(gemma_server)["all_models_loaded"]):
        assert time.monotonic() < deadline, t.seen[-2000:]
        time.sleep(0.1)
    t.type("\x03")
    t.read_until("(stopped)")
    t.read_until("> ")
    deadline = time.monotonic() + 30  # the server saw the client go and stopped the generation
    while any(m.get("is_busy") or m.get("is_streaming") for m in health(gemma_server)["all_models_loaded"]):
        assert time.monotonic() < deadline, health(gemma_server)
        time.sleep(0.1)
    t.type("/help\r")
    t.read_until("Slash commands")
    t.read_until("> ")
    t.type("\x03")
    assert t.wait() == 0


def test_exit_and_ctrl_d_leave(terminal):
    t = terminal("chat", GEMMA_NAME)
    t.read_until("> ")
    t.type("/exit\r")
    assert t.wait() == 0
    t = terminal("chat", GEMMA_NAME)
    t.read_until("> ")
    t.type("\x04")
    assert t.wait() == 0


def test_multiline_input_is_sent_as_one_message(terminal, gemma_server):
    t = terminal("chat", GEMMA_NAME, "--max-tokens", "4")
    t.read_until("> ")
    t.type("/multiline\r")
    t.read_until("Multi-line input on")
    t.read_until("> ")
    before = _requests(gemma_server)
    t.type("First line.\r")
    t.read_until(". ")
    t.type("Second line.\r")
    t.read_until(". ")
    t.type("\r")
    t.read_until(" tok/s")  # the reply's figures
    t.read_until("> ")
    assert _requests(gemma_server) == before + 1
    t.type("/exit\r")
    assert t.wait() == 0


def _requests(server) -> int:
    with server.client() as c:
        return json.loads(c.get("/v1/stats").text)["request_count_total"]


def test_the_quick_start_chat_invocation(gemma_dir, llama_backend, tmp_path):
    """scripts/quickstart.sh ends in `lemonade --no-discovery chat extra.<gemma> --base`, run with
    "Hello" on stdin and no terminal (as .ci/newuser does): it starts a server, answers on stdout."""
    cache = tmp_path / "cache"
    link = cache / "backends" / "llamacpp" / "cpu"
    link.parent.mkdir(parents=True)
    link.symlink_to(llama_backend, target_is_directory=True)
    from tests.conftest import free_port

    env = cli_env(cache, LEMONADE_PORT=str(free_port()))
    ok(lemonade("config", "set", f"extra_models_dir={gemma_dir}", env=env))
    script = Path(__file__).resolve().parents[1] / "scripts" / "quickstart.sh"
    assert 'exec "$LEMONADE" --no-discovery chat "extra.${MODEL_FILE%.gguf}" --base "$@"' in script.read_text()
    server_pid = None
    try:
        proc = lemonade("--no-discovery", "chat", f"extra.{GEMMA_NAME}", "--base", env=env, stdin="Hello\n")
        server_pid = json.loads((cache / "server.pid").read_text())["pid"]
        ok(proc)
        assert proc.stdout.strip() and "User:" not in proc.stdout
    finally:
        if server_pid:
            ok(lemonade("stop", env=env, timeout=60))
