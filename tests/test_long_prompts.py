"""Issue 40, part 5: long prompts never time out before their first token.

While the engine reads a long prompt, a Server-Sent Events stream sends keep-alives (an SSE comment
line for OpenAI chat, completions and Responses; Anthropic's `ping` event for /v1/messages), the
official `openai` and `anthropic` clients parse such streams, a client with a 5 s read timeout gets
its answer, a client that hangs up during the prompt frees the engine's slot on every streaming
surface, and the server's connections have TCP keep-alive. All of it on the real server, the real
llama-server and the real Gemma 3 270M.

"Long" is measured, not assumed: the module first times a prompt of CALIBRATION_WORDS words on the
loaded engine (llama-server's own `prompt_per_second`), then sizes each long prompt to take about
PROMPT_SECONDS of prompt work on this machine, now (a fixed length took 30-50 s per test on 2 busy
cores, and could be over within the first second on a fast machine). That is several times the one
second the server waits for a first token before it starts a response with keep-alives; the client
with a 5 s read timeout gets a prompt of TIMEOUT_PROMPT_SECONDS. Every prompt starts with a number of
its own, so llama-server's prompt cache never shortens one.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from tests.helpers import GEMMA_NAME, SLOTS_POLL_AFTER_HANGUP, Server, wait_for

CALIBRATION_WORDS = 1000
PROMPT_SECONDS = 4.0  # of prompt work: past the first wait (FIRST_CHUNK_WAIT, 1 s) even if the machine gets 2x faster
TIMEOUT_PROMPT_SECONDS = 9.0  # longer than the 5 s read timeout of test_a_client_with_a_5_s_read_timeout...
# A prompt the engine is still reading when it notices a hang-up (within a second) and ends its batch: the
# client leaves a second or two into it, so its length costs nothing.
HANGUP_PROMPT_SECONDS = 8.0
_numbers = itertools.count(int(time.time()) % 100000)


def lemons(words: int) -> str:
    """A prompt of at least `words` tokens that no earlier prompt is a prefix of."""
    return f"{next(_numbers)} " + "lemon " * words + "\nHow many lemons?"


class LongPrompts:
    """Prompts sized by the engine's measured prompt speed."""

    def __init__(self, tokens_per_second: float, context: int) -> None:
        self.tokens_per_second = tokens_per_second
        self.context = context

    def words(self, seconds: float = PROMPT_SECONDS) -> int:
        """About one token per word; never more than half the context (one request's share is all of
        it with the profile's unified KV cache, but a fast machine needs no more)."""
        return max(CALIBRATION_WORDS, min(int(self.tokens_per_second * seconds), self.context // 2))

    def text(self, seconds: float = PROMPT_SECONDS) -> str:
        return lemons(self.words(seconds))


@pytest.fixture(scope="module")
def server(gemma_server: Server) -> Server:
    with gemma_server.client() as c:  # loaded once, so that no test waits for the load
        hello = {"model": GEMMA_NAME, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
        assert c.post("/v1/chat/completions", json=hello).status_code == 200
    return gemma_server


@pytest.fixture(scope="module")
def long(server: Server) -> LongPrompts:
    with server.client(timeout=600) as c:
        resp = c.post("/v1/chat/completions", json={
            "model": GEMMA_NAME, "max_tokens": 1, "messages": [{"role": "user", "content": lemons(CALIBRATION_WORDS)}]})
        assert resp.status_code == 200, resp.text
        timings = resp.json()["timings"]
        context = c.get("/v1/health").json()["all_models_loaded"][0]["context_length"]
    assert timings["prompt_n"] > CALIBRATION_WORDS, timings
    return LongPrompts(timings["prompt_per_second"], context)


def recorder(http: Any) -> Any:
    """An httpx transport (of `http`: the `openai` client takes httpx's, the `anthropic` client its
    fork httpx2's) that keeps every byte of the answers it passes to an official client in `.raw`."""

    class Recorder(http.BaseTransport):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            self.inner = http.HTTPTransport()
            self.raw = bytearray()

        def handle_request(self, request: Any) -> Any:
            resp = self.inner.handle_request(request)
            raw, body = self.raw, resp.stream

            class Tee(http.SyncByteStream):  # type: ignore[misc,name-defined]
                def __iter__(self) -> Iterator[bytes]:
                    for chunk in body:
                        raw.extend(chunk)
                        yield chunk

                def close(self) -> None:
                    body.close()

            return http.Response(resp.status_code, headers=resp.headers, stream=Tee(), extensions=resp.extensions)

        def close(self) -> None:
            self.inner.close()

    return Recorder()


def before_first_event(raw: bytes, marker: bytes) -> bytes:
    """What the stream carried before its first `data:` line that contains `marker`."""
    at = raw.find(marker)
    assert at > 0, raw[:2000]
    return raw[:raw.rfind(b"\n", 0, at) + 1]


# ----- keep-alives, parsed by the official clients -------------------------------------------------

def openai_client(server: Server, transport: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         http_client=httpx.Client(transport=transport, timeout=600))


def test_chat_stream_keeps_alive_during_the_prompt_and_parses_in_openai(server: Server, long: LongPrompts) -> None:
    rec = recorder(httpx)
    stream = openai_client(server, rec).chat.completions.create(
        model=GEMMA_NAME, messages=[{"role": "user", "content": long.text()}], max_tokens=8, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens > long.words()
    head = before_first_event(bytes(rec.raw), b'"choices"')
    assert head.startswith(b": keep-alive\n\n") and set(head.split(b"\n\n")) == {b": keep-alive", b""}, head


def test_completions_stream_keeps_alive_during_the_prompt_and_parses_in_openai(server: Server,
                                                                              long: LongPrompts) -> None:
    rec = recorder(httpx)
    stream = openai_client(server, rec).completions.create(
        model=GEMMA_NAME, prompt=long.text(), max_tokens=8, stream=True, extra_body={"ignore_eos": True})
    text = "".join(c.choices[0].text for c in stream if c.choices)
    assert text
    head = before_first_event(bytes(rec.raw), b'"choices"')
    assert head.startswith(b": keep-alive\n\n") and set(head.split(b"\n\n")) == {b": keep-alive", b""}, head


def test_responses_stream_keeps_alive_during_the_prompt_and_parses_in_openai(server: Server, long: LongPrompts) -> None:
    rec = recorder(httpx)
    stream = openai_client(server, rec).responses.create(
        model=GEMMA_NAME, input=long.text(), max_output_tokens=8, stream=True)
    events = list(stream)
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert events[-1].response.output_text
    head = before_first_event(bytes(rec.raw), b"response.created")
    assert head.startswith(b": keep-alive\n\n") and set(head.split(b"\n\n")) == {b": keep-alive", b""}, head


def test_messages_stream_pings_during_the_prompt_and_parses_in_anthropic(server: Server, long: LongPrompts) -> None:
    """Anthropic's own order: message_start, ping..., then the content blocks."""
    rec = recorder(httpx2)
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0,
                                 http_client=httpx2.Client(transport=rec, timeout=600))
    with client.messages.stream(model=GEMMA_NAME, max_tokens=8,
                                messages=[{"role": "user", "content": long.text()}]) as stream:
        message = stream.get_final_message()
    assert message.content[0].type == "text" and message.usage.input_tokens > long.words()
    names = [line[7:] for line in bytes(rec.raw).decode().splitlines() if line.startswith("event: ")]
    first_block = names.index("content_block_start")
    assert names[0] == "message_start" and names[1:first_block] == ["ping"] * (first_block - 1), names
    assert first_block >= 2, names  # at least one ping: the prompt took longer than the first wait
    assert "ping" not in names[first_block:], names
    pings = [json.loads(line[6:]) for line in bytes(rec.raw).decode().splitlines()
             if line.startswith("data: ") and '"ping"' in line]
    assert pings and all(p == {"type": "ping"} for p in pings)


def test_a_client_with_a_5_s_read_timeout_gets_its_answer(server: Server, long: LongPrompts) -> None:
    """The client gives up after 5 s without a byte; the engine reads the prompt for longer than that
    on the machines this runs on, and the keep-alives carry the connection through."""
    words = long.words(TIMEOUT_PROMPT_SECONDS)
    body = {"model": GEMMA_NAME, "messages": [{"role": "user", "content": lemons(words)}], "max_tokens": 8,
            "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=server.url, timeout=httpx.Timeout(5.0, connect=5.0)) as c, \
            c.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        lines = [line for line in resp.iter_lines() if line]
    assert lines[0] == ": keep-alive" and lines[-1] == "data: [DONE]", lines[:3]
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert data[-1]["timings"]["prompt_n"] > words


def test_an_engine_that_dies_after_keepalives_is_started_again_and_asked_again(server: Server,
                                                                            long: LongPrompts) -> None:
    """The client has seen keep-alives only, nothing of the answer: the engine that died while it read
    the prompt is started again, and the stream goes on with the new one's answer."""
    with server.client() as c:
        pid = c.get("/v1/health").json()["all_models_loaded"][0]["pid"]
        body = {"model": GEMMA_NAME, "messages": [{"role": "user", "content": long.text()}], "max_tokens": 8,
                "stream": True, "ignore_eos": True}
        with c.stream("POST", "/v1/chat/completions", json=body) as resp:
            lines = resp.iter_lines()
            assert next(lines) == ": keep-alive"
            os.kill(pid, signal.SIGKILL)
            rest = [line for line in lines if line]
        assert "event: error" not in rest and rest[-1] == "data: [DONE]", rest[-3:]
        assert set(rest[:rest.index(next(line for line in rest if line.startswith("data:")))]) <= {": keep-alive"}
        events = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
        assert any(e["choices"] and e["choices"][0]["delta"].get("content") for e in events)
        assert c.get("/v1/health").json()["all_models_loaded"][0]["pid"] != pid


def test_short_prompts_start_with_their_first_token(server: Server) -> None:
    """A first token within the first wait: the stream is the engine's, without a keep-alive."""
    with httpx.Client(base_url=server.url, timeout=120) as c, c.stream("POST", "/v1/chat/completions", json={
            "model": GEMMA_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
            "stream": True}) as resp:
        raw = resp.read()
    assert raw.startswith(b"data: {") and b"keep-alive" not in raw, raw[:200]


# ----- a client that leaves during the prompt ------------------------------------------------------

SURFACES: dict[str, tuple[str, dict[str, Any], bytes | None]] = {
    # surface: (path, body, what the stream sends during the prompt, None: nothing)
    "openai-chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "{prompt}"}],
                                             "max_tokens": 2000, "stream": True}, b": keep-alive"),
    "openai-completions": ("/v1/completions", {"prompt": "{prompt}", "max_tokens": 2000, "stream": True},
                           b": keep-alive"),
    "openai-responses": ("/v1/responses", {"input": "{prompt}", "max_output_tokens": 2000, "stream": True},
                         b": keep-alive"),
    "anthropic-messages": ("/v1/messages", {"messages": [{"role": "user", "content": "{prompt}"}],
                                            "max_tokens": 2000, "stream": True}, b"event: ping"),
    "ollama-chat": ("/api/chat", {"messages": [{"role": "user", "content": "{prompt}"}], "stream": True,
                                  "options": {"num_predict": 2000}}, None),
    "ollama-generate": ("/api/generate", {"prompt": "{prompt}", "stream": True, "options": {"num_predict": 2000}},
                        None),
}


def fill(body: Any, prompt: str) -> Any:
    if isinstance(body, dict):
        return {k: fill(v, prompt) for k, v in body.items()}
    if isinstance(body, list):
        return [fill(v, prompt) for v in body]
    return prompt if body == "{prompt}" else body


def raw_request(server: Server, path: str, body: dict[str, Any]) -> socket.socket:
    """The request sent on a socket of our own, so the test decides when the connection closes."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=600)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def busy_slot(c: httpx.Client) -> dict[str, Any] | None:
    return next((s for s in c.get("/v1/slots").json() if s.get("is_processing")), None)


@pytest.mark.parametrize("surface", list(SURFACES))
def test_a_client_gone_during_the_prompt_frees_the_engine(server: Server, long: LongPrompts, surface: str) -> None:
    """The client hangs up while the engine reads its prompt (on an SSE surface, once the keep-alives
    have started): the engine stops before it has read the whole prompt and generates nothing, and
    the model is free again."""
    path, body, during = SURFACES[surface]
    words = long.words(HANGUP_PROMPT_SECONDS)
    sock = raw_request(server, path, fill({"model": GEMMA_NAME, **body}, lemons(words)))
    with server.client() as c:
        try:
            if during is not None:  # the response has started: the keep-alives are coming
                received = b""
                while during not in received:
                    piece = sock.recv(4096)
                    assert piece, received
                    received += piece
                assert b" 200 OK" in received.split(b"\r\n", 1)[0] and b'"delta"' not in received, received
            slot = wait_for(lambda: busy_slot(c), timeout=120, interval=0.02, what="the engine at work")
        finally:
            sock.close()
        wait_for(lambda: not busy_slot(c), timeout=300, interval=SLOTS_POLL_AFTER_HANGUP, what="the engine to stop")
        after = next(s for s in c.get("/v1/slots").json() if s["id"] == slot["id"])
        assert after["id_task"] == slot["id_task"]  # the request of this test, not a later one
        assert after["next_token"][0]["n_decoded"] == 0, after["next_token"]
        assert after["n_prompt_tokens_processed"] < words, after["n_prompt_tokens_processed"]
        health = c.get("/v1/health").json()["all_models_loaded"][0]
        assert not health["is_busy"] and not health["is_streaming"]
        # and it serves the next request at once
        assert c.post("/v1/chat/completions", json={"model": GEMMA_NAME, "max_tokens": 2,
                                                    "messages": [{"role": "user", "content": "Hi"}]}).status_code == 200


# ----- TCP keep-alive --------------------------------------------------------------------------------

def tcp_timer(local_port: int, remote_port: int) -> tuple[int, int]:
    """(timer kind, ticks until it fires) of the server side of a loopback connection, from
    /proc/net/tcp: kind 2 is the keep-alive timer, armed only on a socket with SO_KEEPALIVE."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = (int(part.split(":")[1], 16) for part in fields[1:3])
        if (local, remote) == (local_port, remote_port) and fields[3] == "01":  # established
            kind, ticks = fields[5].split(":")
            return int(kind, 16), int(ticks, 16)
    raise AssertionError(f"no connection {local_port} <- {remote_port} in /proc/net/tcp")


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")
def test_the_server_connections_have_tcp_keepalive(server: Server) -> None:
    """Both listening ports (the API's and the dedicated WebSocket port): the first probe comes after
    15 s of silence (the timer is due within 15 s, not the system's default of two hours)."""
    with server.client() as c:
        ws_port = c.get("/v1/health").json()["websocket_port"]
    for port in (server.port, ws_port):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            sock.recv(4096)  # answered: the server has accepted and set up the connection
            kind, ticks = tcp_timer(port, sock.getsockname()[1])
            assert kind == 2, (port, kind)
            assert 0 < ticks <= 15 * 100, (port, ticks)  # in USER_HZ (100 per second)

