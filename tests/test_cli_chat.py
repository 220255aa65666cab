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

from tests.helpers import GEMMA_NAME, cli_env, lemonade, ok, recording_browser, tuned_args


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
    proc = ok(lemonade("run", GEMMA_NAME, "--chat-cli", "--max-tokens", "8", "--temperature", "0", env=env,
                       stdin="Hello!\n"))
    assert proc.stdout.strip() and "Opened" not in proc.stdout


def test_the_guides_load_examples(env, gemma_server):
    """guide-cli.md "Options for load", with this machine's model and backend."""
    def options() -> dict:
        [loaded] = health(gemma_server)["all_models_loaded"]
        return loaded["recipe_options"]

    ok(lemonade("load", GEMMA_NAME, "--ctx-size", "4096", "--save-options", env=env))
    assert options()["ctx_size"] == 4096
    with gemma_server.client() as c:
        assert c.get(f"/v1/models/{GEMMA_NAME}/options").json()["saved"] == {"ctx_size": 4096}
        c.post(f"/v1/models/{GEMMA_NAME}/options", json={"options": {}})
    ok(lemonade("load", GEMMA_NAME, "--llamacpp", "cpu", env=env))
    assert options()["llamacpp_backend"] == "cpu"
    def with_profile(args: str) -> str:  # the shipped auto-tune profile's flags come first (merged)
        return " ".join(filter(None, [tuned_args(), args]))

    ok(lemonade("load", GEMMA_NAME, "--llamacpp-args", "--flash-attn on -t 2", env=env))
    assert options()["llamacpp_args"] == with_profile("--flash-attn on -t 2")
    # The guide's "--flash-attn on --no-mmap": a memory flag, accepted and given to the pinned engine in
    # its own spelling (--load-mode none); flags that take a path stay refused, naming the flag.
    ok(lemonade("load", GEMMA_NAME, "--llamacpp-args", "--flash-attn on --no-mmap", env=env))
    [loaded] = health(gemma_server)["all_models_loaded"]
    assert "--load-mode none" in " ".join(loaded["launch_command"]), loaded["launch_command"]
    proc = lemonade("load", GEMMA_NAME, "--llamacpp-args", "--flash-attn on --lora x.gguf", env=env)
    assert proc.returncode == 1 and "--lora" in proc.stderr
    ok(lemonade("load", GEMMA_NAME, "--no-merge-args", "--llamacpp-args", "--flash-attn on", env=env))
    assert options()["merge_args"] is False and options()["llamacpp_args"] == "--flash-attn on"
    proc = lemonade("load", GEMMA_NAME, "--llamacpp", "opencl", env=env)
    assert proc.returncode == 1 and "opencl" in proc.stderr


# ----- chat through a pipe -------------------------------------------------------------------------

def test_chat_uses_the_loaded_model_and_takes_slash_commands(env, gemma_server):
    ok(lemonade("load", GEMMA_NAME, env=env))
    script = "\n".join(["/help", "/stats", "/think off", "/think", "Hello there!", "/stats", "/ps", "/list",
                        "/list --all --downloaded", "/list --bogus", "/model No-Such-Model-GGUF",
                        "/system Answer in one word.", "What colour is the sky?", "/nonsense", "/exit",
                        "never sent"]) + "\n"
    proc = ok(lemonade("chat", "--max-tokens", "10", "--temperature", "0", env=env, stdin=script))
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
                       "--temperature", "0", env=env, stdin="Hi\n"))
    assert proc.stdout.strip(), proc.stderr


# A chat template that thinks as Qwen 3's does: the assistant's turn opens with <think> unless
# enable_thinking is false; llama-server then returns what the model writes before </think> as
# reasoning_content. The 270M model never closes it by itself: --reasoning-budget does after 8 tokens.
THINKING_TEMPLATE = """{%- for m in messages -%}
{%- if m['role'] == 'assistant' -%}
<start_of_turn>model
{% if m.get('reasoning_content') %}<think>
{{ m['reasoning_content'] }}
</think>

{% endif %}{{ m['content'] }}<end_of_turn>
{% else -%}
<start_of_turn>{{ m['role'] }}
{{ m['content'] }}<end_of_turn>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<start_of_turn>model
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% else %}<think>
{% endif %}
{%- endif -%}
"""


@pytest.fixture(scope="module")
def thinking_server(module_servers, gemma_dir, tmp_path_factory):
    template = tmp_path_factory.mktemp("template") / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    # The server-wide llama.cpp args are what make Gemma a reasoning model here (see above).
    return module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir),
                               "LEMONADE_LLAMACPP_ARGS": f"--chat-template-file {template} --reasoning-budget 8"})


def test_reasoning_is_yielded_apart_and_never_sent_back(thinking_server):
    from lemonade.cli.chat import Chat
    from lemonade.cli.client import ServerClient

    for stream in (True, False):
        chat = Chat(ServerClient(url=thinking_server.url), GEMMA_NAME, max_tokens=24, temperature=0, stream=stream)
        pieces = list(chat.send("Hi"))
        reasoning = "".join(p for kind, p in pieces if kind == "reasoning")
        content = "".join(p for kind, p in pieces if kind == "content")
        assert reasoning.strip() and content.strip(), pieces
        assert chat.history == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": content}]
        assert chat.last.completion_tokens > 0 and chat.last.prompt_tokens > 0
        chat.think = False  # /think off: the template's enable_thinking=false, no reasoning at all
        assert [kind for kind, _ in chat.send("Again")] and all(kind == "content" for kind, _ in chat.send("More"))


def test_chat_shows_the_reasoning_above_the_answer(thinking_server, tmp_path):
    env = cli_env(tmp_path / "cache", thinking_server.url)
    proc = ok(lemonade("chat", GEMMA_NAME, "--max-tokens", "24", "--temperature", "0", env=env,
                       stdin="Hi\n/think off\nHi\n"))
    assert proc.stderr.count("thinking…") == 1  # the first turn only: /think off came before the second
    with thinking_server.client() as c:  # the same greedy turn, asked directly
        message = c.post("/v1/chat/completions", json={
            "model": GEMMA_NAME, "max_tokens": 24, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}
        ).json()["choices"][0]["message"]
    shown = " ".join(proc.stderr[proc.stderr.index("thinking…"):].split())
    assert " ".join(message["reasoning_content"].split()) in shown  # under the header, on stderr
    # stdout starts with the answer: the reasoning, which came first, is not there
    assert proc.stdout.lstrip().startswith(message["content"].strip()), (proc.stdout, message)


# ----- chat on a terminal --------------------------------------------------------------------------

PROMPT = "\n  > "  # the chat's prompt, at the start of a line (help rows have "<name> " in them)
MORE = "\n  . "  # the continuation prompt of multi-line input


def _controlling_terminal() -> None:
    """In the child, after setsid: its terminal becomes the controlling one, so Ctrl-C is a SIGINT."""
    import fcntl
    import termios

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _controlling_terminal_sigint_ignored() -> None:
    """The same, for a program started with SIGINT ignored (as `cmd &` in a script starts it)."""
    _controlling_terminal()
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Terminal:
    """`lemonade chat` on a pseudo-terminal: what a user sees and types."""

    def __init__(self, args: list[str], env: dict[str, str],
                 program: tuple[str, ...] = ("-m", "lemonade.cli.main"), sigint_ignored: bool = False) -> None:
        import pty

        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen([sys.executable, *program, *args], stdin=slave, stdout=slave,
                                     stderr=slave, env={**env, "TERM": "xterm", "COLUMNS": "100"},
                                     start_new_session=True, preexec_fn=_controlling_terminal_sigint_ignored
                                     if sigint_ignored else _controlling_terminal)
        os.close(slave)
        self.seen = ""
        self.pos = 0  # where the next read_until starts looking

    def read_until(self, text: str, timeout: float = 120) -> str:
        """Output up to the next `text` (after what earlier calls matched); AssertionError naming it otherwise."""
        deadline = time.monotonic() + timeout
        while (found := self.seen.find(text, self.pos)) < 0:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} not seen; output:\n{self.seen[-3000:]}"
            ready, _, _ = select.select([self.master], [], [], min(left, 1.0))
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # the child closed the terminal
                    chunk = b""
                assert chunk, f"{text!r} not seen before the program ended; output:\n{self.seen[-3000:]}"
                self.seen += chunk.decode(errors="replace")
        start, self.pos = self.pos, found + len(text)
        return self.seen[start:self.pos]

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def wait(self, timeout: float = 30) -> int:
        """The exit code, once the program ended; what it wrote meanwhile joins `seen`."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None or select.select([self.master], [], [], 0)[0]:
            assert time.monotonic() < deadline, f"still running; output:\n{self.seen[-3000:]}"
            if select.select([self.master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                self.seen += chunk.decode(errors="replace")
        return self.proc.wait(timeout)

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
    t.read_until(PROMPT)
    t.type("Write a very long story about a lemon tree, with many chapters.\r")
    t.read_until("\n", timeout=60)  # the line typed
    deadline = time.monotonic() + 120
    while not any(m.get("is_streaming") for m in health(gemma_server)["all_models_loaded"]):
        assert time.monotonic() < deadline, t.seen[-2000:]
        time.sleep(0.1)
    t.type("\x03")
    t.read_until("(stopped)")
    t.read_until(PROMPT)
    deadline = time.monotonic() + 30  # the server saw the client go and stopped the generation
    while any(m.get("is_busy") or m.get("is_streaming") for m in health(gemma_server)["all_models_loaded"]):
        assert time.monotonic() < deadline, health(gemma_server)
        time.sleep(0.1)
    t.type("/help\r")
    t.read_until("Slash commands")
    t.read_until(PROMPT)
    t.type("\x03")
    assert t.wait() == 0, t.seen[t.pos:]


def test_ctrl_c_the_moment_the_prompt_shows_is_never_lost(env):
    """CPython's readline misses a SIGINT that lands between writing the prompt and waiting for a key
    (chat_cmd._ctrl_c_always_reaches_input). Typed the moment the prompt is seen, on a machine kept
    busy (the race needs the prompt's process to be descheduled in between: without the fix, 18 of
    40 such Ctrl-Cs were lost with 3 busy loops, none on an idle machine), Ctrl-C leaves every time."""
    read_prompt = ("-c", "from lemonade.cli.chat_cmd import Prompt; Prompt(True).read()")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        for attempt in range(20):
            t = Terminal([], env, program=read_prompt)
            try:
                t.read_until(PROMPT.lstrip("\n"), timeout=60)
                t.type("\x03")
                assert t.wait(10) == 0, f"attempt {attempt}: Ctrl-C lost at the prompt"
            finally:
                t.close()
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()


def test_ctrl_c_works_when_the_chat_was_started_with_sigint_ignored(env):
    """A chat started with SIGINT ignored (a background job of a shell without job control, `nohup`,
    some CI runners) would get no KeyboardInterrupt from Python at all; on a terminal the chat takes
    Ctrl-C back (chat_cmd._take_ctrl_c)."""
    read_prompt = ("-c", "import signal; from lemonade.cli.chat_cmd import Prompt\n"
                         "assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN\nPrompt(True).read()")
    t = Terminal([], env, program=read_prompt, sigint_ignored=True)
    try:
        t.read_until(PROMPT.lstrip("\n"), timeout=60)
        t.type("\x03")
        assert t.wait(10) == 0, "Ctrl-C did nothing"
    finally:
        t.close()


def test_exit_ctrl_d_and_clearing_the_line(terminal):
    """/exit and Ctrl-D leave; Esc and Ctrl-U clear what was typed (else "junk/exit" would be sent as a
    message and the chat would go on)."""
    t = terminal("chat", GEMMA_NAME)
    t.read_until(PROMPT)
    t.type("junk\x15/exit\r")  # Ctrl-U
    assert t.wait() == 0, t.seen[t.pos:]
    t = terminal("chat", GEMMA_NAME)
    t.read_until(PROMPT)
    t.type("junk\x1b")  # Esc, alone: readline waits for its key-sequence timeout to know it is not a prefix
    time.sleep(1.5)
    t.type("/exit\r")
    assert t.wait() == 0, t.seen[t.pos:]
    t = terminal("chat", GEMMA_NAME)
    t.read_until(PROMPT)
    t.type("\x04")
    assert t.wait() == 0


def test_multiline_input_is_sent_as_one_message(terminal, gemma_server):
    t = terminal("chat", GEMMA_NAME, "--max-tokens", "4")
    t.read_until(PROMPT)
    t.type("/multiline\r")
    t.read_until("Multi-line input on")
    t.read_until(PROMPT)
    before = _requests(gemma_server)
    t.type("First line.\r")
    t.read_until(MORE)
    t.type("Second line.\r")
    t.read_until(MORE)
    t.type("\r")
    t.read_until(" tok/s")  # the reply's figures
    t.read_until(PROMPT)
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
    from tests.helpers import free_port

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
