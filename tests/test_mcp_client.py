"""The server as an MCP client (issue 43, item 11; upstream d1e42bab7): stdio MCP servers registered
through `/internal/mcp/servers`, kept in the config dir, connected, their tools listed and called, and
offered to omni collections.

The MCP server is real: a small program written with the official `mcp` package (`MCPServer` over
stdio, below), run by our server with the test's Python. Its tools add numbers, read a secret from its
environment (given as a `${VARIABLE}` reference, so only the reference is stored), write a note to a
file (what the omni test checks) and exit on request (a crash the client must notice).
The servers here set `LEMONADE_ADMIN_API_KEY`: these routes start programs, so a server without any
key refuses them (checked below), as upstream's does.
"""

from __future__ import annotations

import json
import signal
import stat
import sys
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from tests.helpers import GEMMA_NAME, wait_for

ADMIN = {"Authorization": "Bearer admin-key"}
KEYED = {"LEMONADE_ADMIN_API_KEY": "admin-key", "NOTES_SECRET": "kumquat-42"}
SERVER_SCRIPT = '''
import os, sys
from mcp.server.mcpserver import MCPServer

notes_file, pid_file = sys.argv[1], sys.argv[2]
with open(pid_file, "w") as fh:
    fh.write(str(os.getpid()))
server = MCPServer("notes")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def secret() -> str:
    """The secret word of this server's environment."""
    return "The secret is " + os.environ.get("SECRET_WORD", "(unset)")


@server.tool()
def remember(note: str) -> str:
    """Write a note down."""
    with open(notes_file, "a") as fh:
        fh.write(note + "\\n")
    return "Noted."


@server.tool()
def crash() -> str:
    """Exit at once (for tests)."""
    os._exit(3)


server.run()
'''


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mcp-server") / "notes_server.py"
    path.write_text(SERVER_SCRIPT)
    return path


def entry(script: Path, work: Path, **extra) -> dict:
    return {"id": "notes", "name": "Notes", "command": sys.executable,
            "args": [str(script), str(work / "notes.txt"), str(work / "pid")],
            "env": {"SECRET_WORD": "${NOTES_SECRET}"}, "timeout_ms": 20000, **extra}


def pid_of(work: Path) -> int:
    return int((work / "pid").read_text())


@pytest.fixture(scope="module")
def server(module_servers, gemma_dir):
    return module_servers(env={**KEYED, "LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})


@pytest.fixture(scope="module")
def http(server):
    with server.client(headers=ADMIN, timeout=120) as client:
        yield client


def test_a_server_without_a_key_does_not_offer_it(make_server):
    """No key at all: the routes that start programs are closed (403, naming the variables), where
    the other /internal routes are open on such a server."""
    srv = make_server()
    with srv.client() as c:
        for method, path in (("GET", "/internal/mcp/servers"), ("POST", "/internal/mcp/servers"),
                             ("GET", "/internal/mcp/tools"), ("POST", "/internal/mcp/servers/x/connect")):
            resp = c.request(method, path, json={})
            assert resp.status_code == 403 and "LEMONADE_ADMIN_API_KEY" in resp.text, (path, resp.text)
        assert c.get("/internal/config").status_code == 200


def test_bad_entries_and_requests_are_refused_naming_the_field(http, script, tmp_path):
    good = entry(script, tmp_path, id="checked")
    cases = [({k: v for k, v in good.items() if k != "command"}, "'command' is required"),
             ({**good, "env": {"SECRET_WORD": "kumquat"}}, "'env.SECRET_WORD' must be a reference"),
             ({**good, "timeout_ms": 10}, "'timeout_ms' must be an integer from 1000 to 300000"),
             ({**good, "transport": "http"}, "'transport' must be 'stdio'"),
             ({**good, "id": "no spaces"}, "'id' must be 1 to 96"),
             ({**good, "args": "--x"}, "'args' must be an array of strings"),
             ({**good, "enabled": "yes"}, "'enabled' must be true or false"),
             ([good], "must be a JSON object")]
    for body, message in cases:
        resp = http.post("/internal/mcp/servers", json=body)
        assert resp.status_code == 400 and message in resp.json()["error"]["message"], (body, resp.text)
    assert all(s["id"] != "checked" for s in http.get("/internal/mcp/servers").json()["servers"])
    assert http.post("/internal/mcp/servers/nope/connect").status_code == 404
    assert http.delete("/internal/mcp/servers/nope").status_code == 404
    off = http.post("/internal/mcp/servers", json={**good, "id": "off", "enabled": False})
    assert off.status_code == 200
    assert http.post("/internal/mcp/servers/off/connect").status_code == 409
    missing = http.post("/internal/mcp/servers", json={**good, "id": "noenv", "env": {"X": "${NOT_SET_ANYWHERE}"}})
    assert missing.status_code == 200  # stored; the variable is read when the server starts
    refused = http.post("/internal/mcp/servers/noenv/connect")
    assert refused.status_code == 400 and "NOT_SET_ANYWHERE" in refused.json()["error"]["message"]
    broken = http.post("/internal/mcp/servers", json={**good, "id": "broken", "command": "/no/such/program"})
    assert broken.status_code == 200
    failed = http.post("/internal/mcp/servers/broken/connect")
    assert failed.status_code == 502 and "broken" in failed.json()["error"]["message"]
    for name in ("off", "noenv", "broken"):
        assert http.delete(f"/internal/mcp/servers/{name}").json() == {"removed": name}


def test_register_connect_list_and_call(server, http, script, tmp_path):
    """The admin registers an entry (stored with its env reference, never the value, owner-readable
    only), connects it (the server's name and tools), and calls tools (the result as MCP gives it;
    the secret comes from the environment variable the reference names)."""
    assert httpx.get(server.url + "/internal/mcp/servers", timeout=30,
                     headers={"Authorization": "Bearer wrong"}).status_code == 401
    resp = http.post("/internal/mcp/servers", json={"server": entry(script, tmp_path)})
    assert resp.status_code == 200, resp.text
    assert resp.json()["server"] == {
        "id": "notes", "name": "Notes", "transport": "stdio", "command": sys.executable,
        "args": [str(script), str(tmp_path / "notes.txt"), str(tmp_path / "pid")],
        "env": {"SECRET_WORD": "${NOTES_SECRET}"}, "working_dir": "", "enabled": True, "timeout_ms": 20000}
    stored = server.config_dir / "mcp_servers.json"
    assert json.loads(stored.read_text())["servers"][0]["env"] == {"SECRET_WORD": "${NOTES_SECRET}"}
    assert "kumquat" not in stored.read_text() and stat.S_IMODE(stored.stat().st_mode) == 0o600
    listed = http.get("/internal/mcp/servers").json()["servers"]
    assert [(s["id"], s["status"], s["tools"]) for s in listed] == [("notes", "disconnected", [])]

    connected = http.post("/internal/mcp/servers/notes/connect").json()["server"]
    assert connected["status"] == "connected" and connected["connected"] is True and connected["last_error"] == ""
    assert connected["server_info"]["name"] == "notes" and connected["protocol_version"]
    assert sorted(t["name"] for t in connected["tools"]) == ["add", "crash", "remember", "secret"]
    tools = {t["name"]: t for t in http.get("/internal/mcp/tools").json()["tools"]}
    assert tools["add"]["chat_name"] == "mcp_notes__add" and tools["add"]["server_id"] == "notes"
    assert tools["add"]["openai_tool"]["function"]["name"] == "mcp_notes__add"
    assert tools["add"]["openai_tool"]["function"]["description"] == "[Notes] Add two integers."
    assert set(tools["add"]["inputSchema"]["properties"]) == {"a", "b"}

    added = http.post("/internal/mcp/servers/notes/tools/call", json={"name": "add", "arguments": {"a": 2, "b": 3}})
    assert added.status_code == 200, added.text
    body = added.json()
    assert body["server_id"] == "notes" and body["tool"] == "add"
    assert body["result"]["content"][0] == {"type": "text", "text": "5"} and not body["result"].get("isError")
    secret = http.post("/internal/mcp/servers/notes/tools/call", json={"name": "secret"}).json()
    assert secret["result"]["content"][0]["text"] == "The secret is kumquat-42"
    for bad, message in (({"arguments": {}}, "'name' is required"), ({"name": "add", "arguments": [1]}, "'arguments'"),
                         ({"name": "add", "timeout_ms": 5}, "'timeout_ms'")):
        resp = http.post("/internal/mcp/servers/notes/tools/call", json=bad)
        assert resp.status_code == 400 and message in resp.text, resp.text
    unknown = http.post("/internal/mcp/servers/notes/tools/call", json={"name": "nope"})
    assert unknown.status_code in (200, 502) and ("nope" in unknown.text)  # MCP says so: an error result or refusal
    refreshed = http.post("/internal/mcp/servers/notes/refresh-tools").json()["server"]
    assert len(refreshed["tools"]) == 4


def test_omni_collection_calls_the_mcp_tools(server, http, script, tmp_path):
    """A connected server's tools are offered to an omni collection's LLM (Gemma 3 270M) as
    `mcp_notes__<tool>`; its call runs on the MCP server (the note it wrote is on disk) and the loop
    goes on with the result. Disconnected, the tools are no longer offered (naming one is a 400)."""
    notes = tmp_path / "omni-notes.txt"
    resp = http.post("/internal/mcp/servers", json=entry(script, tmp_path, id="omni-notes",
                                                         args=[str(script), str(notes), str(tmp_path / "pid")]))
    assert resp.status_code == 200 and http.post("/internal/mcp/servers/omni-notes/connect").status_code == 200
    assert http.post("/v1/pull", json={"model_name": "user.NoteKit", "recipe": "collection.omni",
                                       "components": [GEMMA_NAME]}).status_code == 200
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="admin-key", max_retries=0, timeout=600)
    remember = {"type": "function", "function": {"name": "mcp_omni-notes__remember"}}
    # An earlier exchange for the 270M model to copy: on its own it writes a note until max_tokens.
    call = {"id": "r0", "type": "function",
            "function": {"name": "mcp_omni-notes__remember", "arguments": json.dumps({"note": "I like coffee."})}}
    earlier = [{"role": "user", "content": "Remember that I like coffee."},
               {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "r0", "content": "Noted."},
               {"role": "assistant", "content": "I noted that you like coffee."}]
    asked = {"role": "user", "content": "Remember that I like tea."}
    answer = client.chat.completions.create(model="user.NoteKit", max_tokens=48, temperature=0, tool_choice=remember,
                                            messages=[*earlier, asked])
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert notes.is_file() and "tea" in notes.read_text(), "the MCP tool was not called with the note"
    http.post("/internal/mcp/servers/omni-notes/disconnect")
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="user.NoteKit", max_tokens=4, tool_choice=remember,
                                       messages=[{"role": "user", "content": "Remember this."}])
    assert "tool_choice" in str(refused.value)
    assert http.delete("/internal/mcp/servers/omni-notes").status_code == 200


def test_a_server_that_exits_is_reported_and_connects_again(http, script, tmp_path):
    """The MCP server's process exits during a call: the call is a 502, the entry shows it
    disconnected with what happened (at once: its output ended), and connect starts it again."""
    assert http.post("/internal/mcp/servers", json=entry(script, tmp_path, id="crashy")).status_code == 200
    assert http.post("/internal/mcp/servers/crashy/connect").status_code == 200
    first = pid_of(tmp_path)
    crashed = http.post("/internal/mcp/servers/crashy/tools/call", json={"name": "crash"})
    assert crashed.status_code == 502 and "crashy" in crashed.json()["error"]["message"]

    def state() -> dict:
        return next(s for s in http.get("/internal/mcp/servers").json()["servers"] if s["id"] == "crashy")

    wait_for(lambda: state()["status"] == "disconnected", timeout=30)
    assert "exited" in state()["last_error"] and state()["tools"] == []
    assert not any(t["server_id"] == "crashy" for t in http.get("/internal/mcp/tools").json()["tools"])
    assert http.post("/internal/mcp/servers/crashy/connect").json()["server"]["status"] == "connected"
    assert pid_of(tmp_path) != first
    stopped = http.post("/internal/mcp/servers/crashy/disconnect").json()["server"]
    assert stopped["status"] == "disconnected" and stopped["last_error"] == ""
    wait_for(lambda: not psutil.pid_exists(pid_of(tmp_path)), timeout=30)
    assert http.delete("/internal/mcp/servers/crashy").json() == {"removed": "crashy"}


def test_entries_survive_a_restart_and_servers_stop_with_it(make_server, script, tmp_path):
    """Stopping the server stops the MCP servers it started; the entries are there after a restart,
    disconnected until something connects them."""
    srv = make_server(env=KEYED)
    with srv.client(headers=ADMIN, timeout=120) as c:
        assert c.post("/internal/mcp/servers", json=entry(script, tmp_path)).status_code == 200
        assert c.post("/internal/mcp/servers/notes/connect").status_code == 200
    started = pid_of(tmp_path)
    srv.proc.send_signal(signal.SIGTERM)  # a user's stop; the fixture's clean-up would kill leftovers itself
    srv.proc.wait(30)
    assert not psutil.pid_exists(started) or psutil.Process(started).status() == psutil.STATUS_ZOMBIE
    srv.stop()
    again = make_server(env=KEYED, cache=srv.cache)
    with again.client(headers=ADMIN, timeout=120) as c:
        kept = c.get("/internal/mcp/servers").json()["servers"]
        assert [(s["id"], s["status"]) for s in kept] == [("notes", "disconnected")]  # connecting is asked for
        call = c.post("/internal/mcp/servers/notes/tools/call", json={"name": "add", "arguments": {"a": 1, "b": 1}})
        assert call.json()["result"]["content"][0]["text"] == "2"  # a call connects first, as upstream's does
