"""Issue 5, part 2: Anthropic's Messages API through the official `anthropic` Python client (and httpx
for raw SSE and bad inputs), against the real server with the real Gemma 3 270M. A base model:
answers are checked for shape, not meaning. (This SDK no longer has `temperature`/`top_p`/`top_k`
arguments, so they travel in `extra_body`, as they do on the wire.)
"""

from __future__ import annotations

import json
import os
import signal
import time

import anthropic
import httpx
import pytest

from tests.helpers import GEMMA_NAME, Server

GREEDY = {"temperature": 0, "top_k": 1, "top_p": 1}
WEATHER_TOOL = {"name": "get_weather", "description": "Get the weather of a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
EVENT_ORDER = ["message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
               "message_stop"]


def weather_history() -> list[dict]:
    """Three worked tool_use / tool_result rounds, then a new question: the base model continues the pattern."""
    history: list[dict] = []
    for i, city in enumerate(("Paris", "Rome", "Oslo")):
        history += [
            {"role": "user", "content": f"Weather in {city}?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i}", "name": "get_weather",
                                               "input": {"city": city}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "sunny"}]},
            {"role": "assistant", "content": f"It is sunny in {city}."},
        ]
    return history + [{"role": "user", "content": "Weather in Berlin?"}]


@pytest.fixture(scope="module")
def client(gemma_server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gemma_server.url, api_key="unused", max_retries=0, timeout=300)


def collapse(events: list[str]) -> list[str]:
    """The event sequence with repeats folded, e.g. start, block_start, delta, block_stop, ..."""
    out: list[str] = []
    for name in events:
        if not out or out[-1] != name:
            out.append(name)
    return out


# ----- answers -------------------------------------------------------------------------------------

def test_message(client: anthropic.Anthropic) -> None:
    msg = client.messages.create(model=GEMMA_NAME, max_tokens=8, system="You are brief.",
                                 messages=[{"role": "user", "content": "Hello"}], extra_body=GREEDY)
    assert msg.type == "message" and msg.role == "assistant" and msg.model == GEMMA_NAME
    assert msg.id.startswith("msg_")
    assert msg.content[0].type == "text" and msg.content[0].text
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.stop_sequence is None
    assert msg.usage.input_tokens > 0 and 0 < msg.usage.output_tokens <= 8


def test_system_blocks_and_content_blocks(client: anthropic.Anthropic) -> None:
    msg = client.messages.create(
        model=GEMMA_NAME, max_tokens=6,
        system=[{"type": "text", "text": "You are brief."}, {"type": "text", "text": "Answer in English."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]},
                  {"role": "assistant", "content": [{"type": "text", "text": "Hi!"}]},
                  {"role": "user", "content": "How are you?"}])
    assert msg.content and msg.content[0].type == "text" and msg.usage.output_tokens > 0


def test_stop_sequences(client: anthropic.Anthropic) -> None:
    stops = ["e", "a", "o", "i", "\n"]
    msg = client.messages.create(model=GEMMA_NAME, max_tokens=40, stop_sequences=stops, extra_body=GREEDY,
                                 messages=[{"role": "user", "content": "Write a sentence about the sea."}])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence in stops


def test_stream_event_sequence(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model=GEMMA_NAME, max_tokens=8, extra_body=GREEDY,
                                messages=[{"role": "user", "content": "Tell me a story"}]) as stream:
        events = [event.type for event in stream if event.type in EVENT_ORDER]
        final = stream.get_final_message()
    assert collapse(events) == EVENT_ORDER
    assert final.content[0].type == "text" and final.content[0].text
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.output_tokens > 0 and final.usage.input_tokens > 0


def test_raw_sse_wire_format(gemma_server: Server) -> None:
    """Each event is `event: <type>` plus `data: {"type": <type>, ...}`; message_delta carries the stop reason."""
    body = {"model": GEMMA_NAME, "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "Hi"}],
            "metadata": {"user_id": "u-1"}}
    seen: list[tuple[str, dict]] = []
    with gemma_server.client() as c, c.stream("POST", "/v1/messages?beta=true", json=body) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        assert "metadata" in resp.headers["x-lemonade-warning"]
        name = None
        for line in resp.iter_lines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data = json.loads(line[5:])
                assert data["type"] == name
                seen.append((name, data))
    assert [n for n, _ in seen][0] == "message_start" and seen[-1][0] == "message_stop"
    delta = next(d for n, d in seen if n == "message_delta")
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens") and delta["usage"]["output_tokens"] > 0
    starts = [d for n, d in seen if n == "content_block_start"]
    assert [d["index"] for d in starts] == list(range(len(starts)))


def test_engine_dying_mid_stream_is_an_error_event(client: anthropic.Anthropic, gemma_server: Server) -> None:
    with pytest.raises(anthropic.APIError) as err:  # noqa: PT012 - the failure comes while iterating
        with client.messages.stream(model=GEMMA_NAME, max_tokens=4000,
                                    messages=[{"role": "user", "content": "Write a long story"}]) as stream:
            for event in stream:
                if event.type == "content_block_delta":
                    for pid in gemma_server.engine_pids():
                        os.kill(pid, signal.SIGKILL)
    assert "engine" in str(err.value)
    # once the server has noticed the crash, the next request starts the engine again
    deadline = time.monotonic() + 30
    with gemma_server.client() as c:
        while any(m["model_name"] == GEMMA_NAME for m in c.get("/v1/health").json().get("all_models_loaded", [])) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
    assert client.messages.create(model=GEMMA_NAME, max_tokens=4, messages=[{"role": "user", "content": "Hi"}]).content


def test_prompt_longer_than_the_context_is_the_clients_error_streamed_or_not(gemma_server: Server) -> None:
    """Both answers say invalid_request_error (what Lemonade's clients match on), the stream as its
    one `error` event, with no message_stop after it."""
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 200  # about 2000 tokens
    body = {"model": GEMMA_NAME, "max_tokens": 8, "messages": [{"role": "user", "content": long_prompt}]}
    with gemma_server.client() as c:
        # A context smaller than the prompt, set for this load only: the overflow is what is under test.
        assert c.post("/v1/load", json={"model_name": GEMMA_NAME, "ctx_size": 512}).status_code == 200
        try:
            plain = c.post("/v1/messages", json=body)
            assert plain.status_code == 400 and plain.json()["error"]["type"] == "invalid_request_error"
            assert "context" in plain.json()["error"]["message"]
            events: list[tuple[str, dict]] = []
            with c.stream("POST", "/v1/messages", json={**body, "stream": True}) as resp:
                name = None
                for line in resp.iter_lines():
                    if line.startswith("event:"):
                        name = line[6:].strip()
                    elif line.startswith("data:"):
                        events.append((name, json.loads(line[5:])))
            errors = [d for n, d in events if n == "error"]
            assert len(errors) == 1 and errors[0]["error"]["type"] == "invalid_request_error", events
            assert "context" in errors[0]["error"]["message"]
            assert "message_stop" not in [n for n, _ in events]
        finally:
            c.post("/v1/unload", json={"model_name": GEMMA_NAME})


# ----- tools ---------------------------------------------------------------------------------------

def test_tool_use_and_tool_result(client: anthropic.Anthropic) -> None:
    history = weather_history()
    msg = client.messages.create(model=GEMMA_NAME, max_tokens=40, tools=[WEATHER_TOOL], messages=history,
                                 extra_body=GREEDY)
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert uses and uses[0].name == "get_weather" and isinstance(uses[0].input, dict) and "city" in uses[0].input
    assert uses[0].id and msg.stop_reason in ("tool_use", "max_tokens")
    # The caller runs the tool and sends the result back: the conversation continues.
    follow = client.messages.create(
        model=GEMMA_NAME, max_tokens=8, tools=[WEATHER_TOOL],
        messages=[*history, {"role": "assistant", "content": [u.model_dump() for u in uses]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                "content": [{"type": "text", "text": "rainy"}]}]}])
    assert follow.type == "message" and follow.content


def test_tool_use_stream(client: anthropic.Anthropic) -> None:
    """A streamed call is one `tool_use` block: started with its id and name, its `input_json_delta`s
    inside it, and those pieces concatenate to the JSON of the final message's input."""
    with client.messages.stream(model=GEMMA_NAME, max_tokens=40, tools=[WEATHER_TOOL], messages=weather_history(),
                                extra_body=GREEDY) as stream:
        events = [e for e in stream if e.type.startswith("content_block")]
        final = stream.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and "city" in uses[0].input
    starts = [e for e in events if e.type == "content_block_start" and e.content_block.type == "tool_use"]
    assert len(starts) == 1 and starts[0].content_block.name == "get_weather" and starts[0].content_block.id
    index = starts[0].index
    mine = [e for e in events if e.index == index]
    assert mine[0].type == "content_block_start" and mine[-1].type == "content_block_stop"
    pieces = [e.delta.partial_json for e in mine[1:-1]]
    assert pieces and all(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in mine[1:-1])
    assert json.loads("".join(pieces)) == uses[0].input
    assert final.stop_reason in ("tool_use", "max_tokens") and final.content[-1].type == "tool_use"


def test_tool_choice_names_a_tool(client: anthropic.Anthropic) -> None:
    """A named tool is used, even where the model has no example to imitate and would rather tell a
    joke (llama-server's "required" let it)."""
    joke = [{"role": "user", "content": "Tell me a joke about cats."}]
    tools = [{**WEATHER_TOOL, "name": "get_time"}, WEATHER_TOOL]
    choice = {"type": "tool", "name": "get_weather"}
    msg = client.messages.create(model=GEMMA_NAME, max_tokens=60, extra_body=GREEDY, messages=joke, tools=tools,
                                 tool_choice=choice)
    assert [b.type for b in msg.content] == ["tool_use"] and msg.stop_reason == "tool_use"
    assert msg.content[0].name == "get_weather" and isinstance(msg.content[0].input["city"], str)
    with client.messages.stream(model=GEMMA_NAME, max_tokens=60, extra_body=GREEDY, messages=joke, tools=tools,
                                tool_choice=choice) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["tool_use"] and final.stop_reason == "tool_use"
    assert final.content[0].name == "get_weather" and final.content[0].input == msg.content[0].input


# ----- compatibility -------------------------------------------------------------------------------

def test_beta_query_and_unsupported_fields_warn(client: anthropic.Anthropic) -> None:
    raw = client.beta.messages.with_raw_response.create(
        model=GEMMA_NAME, max_tokens=4, messages=[{"role": "user", "content": "Hi"}],
        metadata={"user_id": "u-1"}, service_tier="auto", extra_query={"beta": "true"})
    assert raw.http_request.url.params.get("beta") == "true"
    warning = raw.headers.get("x-lemonade-warning", "")
    assert "metadata" in warning and "service_tier" in warning
    assert raw.parse().content[0].type == "text"


def test_count_tokens(client: anthropic.Anthropic) -> None:
    short = client.messages.count_tokens(model=GEMMA_NAME, messages=[{"role": "user", "content": "Hi"}])
    longer = client.messages.count_tokens(model=GEMMA_NAME, system="You are a helpful assistant.",
                                          messages=[{"role": "user", "content": "Hi, how are you today?"}])
    assert 0 < short.input_tokens < longer.input_tokens


def test_unknown_model_is_anthropic_404(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "not_found_error"


def _image(media_type: str = "image/png") -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": "iVBORw0KGgo="}}


@pytest.mark.parametrize(("body", "mentions"), [
    ({"model": GEMMA_NAME, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"model": GEMMA_NAME, "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"model": GEMMA_NAME, "max_tokens": 4, "messages": []}, "messages"),
    ({"model": GEMMA_NAME, "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
    ({"model": GEMMA_NAME, "max_tokens": 4, "temperature": 3, "messages": [{"role": "user", "content": "x"}]},
     "temperature"),
    ({"model": GEMMA_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages.0.content.0.text"),
    ({"model": GEMMA_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}, "assistant messages"),
    ({"model": GEMMA_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "content": "x"}]}]}, "tool_use_id"),
    ({"model": GEMMA_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": [_image("image/tiff")]}]},
     "media_type"),
    ({"model": GEMMA_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": [_image()]}]},
     "does not accept images"),
    ({"model": GEMMA_NAME, "max_tokens": 4, "tools": [{"name": "f"}], "messages": [{"role": "user", "content": "x"}]},
     "tools.0.input_schema"),
    ({"model": GEMMA_NAME, "max_tokens": 4, "tools": [WEATHER_TOOL], "tool_choice": {"type": "tool"},
      "messages": [{"role": "user", "content": "x"}]}, "name"),
    ({"model": GEMMA_NAME, "max_tokens": 4, "tools": [WEATHER_TOOL], "tool_choice": {"type": "tool", "name": "nope"},
      "messages": [{"role": "user", "content": "x"}]}, "tool_choice.name"),
])
def test_bad_input_is_400_in_anthropic_shape(gemma_server: Server, body: dict, mentions: str) -> None:
    with gemma_server.client() as c:
        resp = c.post("/v1/messages", json=body)
    assert resp.status_code == 400, resp.text
    error = resp.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert mentions in error["error"]["message"], error


def test_not_json_is_400(gemma_server: Server) -> None:
    with gemma_server.client() as c:
        resp = c.post("/v1/messages", content=b"{nope", headers={"Content-Type": "application/json"})
    assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"


def test_api_key_via_x_api_key(make_server, gemma_dir) -> None:
    srv = make_server(env={"LEMONADE_API_KEY": "s3cret", "LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    wrong = anthropic.Anthropic(base_url=srv.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as err:
        wrong.messages.count_tokens(model=GEMMA_NAME, messages=[{"role": "user", "content": "x"}])
    assert err.value.body["error"]["type"] == "authentication_error"
    right = anthropic.Anthropic(base_url=srv.url, api_key="s3cret", max_retries=0, timeout=300)
    assert right.messages.count_tokens(model=GEMMA_NAME, messages=[{"role": "user", "content": "x"}]).input_tokens > 0
    assert httpx.post(srv.url + "/v1/messages", json={}).status_code == 401
