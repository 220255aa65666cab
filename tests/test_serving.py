"""Issue 3: serving a real model (Gemma 3 270M) through llama-server, with the official openai client.

Gemma 3 270M is a base model, so assertions are about structure and behaviour, not wording.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import threading
import time

import httpx
import openai
import psutil
import pytest

from lemonade.catalog.gguf_meta import gguf_info
from tests.gguf_factory import write_gguf
from tests.helpers import (
    GEMMA_ID,
    GEMMA_NAME,
    SLOTS_POLL_AFTER_HANGUP,
    WEATHER_TOOLS,
    tuned_args,
    wait_for,
    weather_history,
)

CHAT = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def server(gemma_server):
    return gemma_server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


# ----- OpenAI endpoints ------------------------------------------------------------------------

def test_chat_non_stream(client):
    resp = client.chat.completions.create(model=GEMMA_NAME, messages=CHAT, max_tokens=8, temperature=0.7,
                                          top_p=0.9, extra_body={"top_k": 40, "repeat_penalty": 1.1})
    assert resp.object == "chat.completion" and resp.model == GEMMA_NAME
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].finish_reason in ("stop", "length")
    assert resp.usage.completion_tokens <= 8 and resp.usage.prompt_tokens > 5


def test_chat_stream(client):
    stream = client.chat.completions.create(model=GEMMA_NAME, messages=CHAT, max_tokens=12, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 3 and text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length") or chunks[-2].choices[0].finish_reason


def test_chat_async_concurrent(server):
    async def run():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        results = await asyncio.gather(*(client.chat.completions.create(
            model=GEMMA_NAME, messages=CHAT, max_tokens=6) for _ in range(3)))
        await client.close()
        return results
    for resp in asyncio.run(run()):
        assert resp.choices[0].message.content is not None


def test_stop_and_max_completion_tokens(client):
    resp = client.chat.completions.create(model=GEMMA_NAME, messages=[{"role": "user", "content": "Count: 1 2 3"}],
                                          max_completion_tokens=20, stop=["5"], temperature=0)
    assert "5" not in resp.choices[0].message.content
    assert resp.usage.completion_tokens <= 20


def test_max_tokens_and_max_completion_tokens_together(client):
    # Accepted together, as Lemonade's server does; `max_tokens` is the limit then.
    resp = client.chat.completions.create(model=GEMMA_NAME, messages=CHAT, max_tokens=3, max_completion_tokens=30,
                                          temperature=0)
    assert resp.usage.completion_tokens <= 3


def test_chat_logprobs(client):
    resp = client.chat.completions.create(model=GEMMA_NAME, messages=CHAT, max_tokens=4, logprobs=True,
                                          top_logprobs=2)
    content = resp.choices[0].logprobs.content
    assert content and all(tok.logprob <= 0 for tok in content) and len(content[0].top_logprobs) == 2


def test_tools_passed_through_and_tool_calls_returned(client):
    """The grammar keeps the call valid."""
    resp = client.chat.completions.create(model=GEMMA_NAME, messages=weather_history(), tools=WEATHER_TOOLS,
                                          tool_choice="required", max_tokens=40, temperature=0)
    calls = resp.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    assert "city" in json.loads(calls[0].function.arguments)


def test_streamed_tool_call_is_relayed_as_llama_server_sends_it(client, server):
    """OpenAI surface: the tool-call deltas reach the official client as llama-server streams them
    (same greedy request asked of the engine directly), and they add up to one complete call."""
    body = {"model": GEMMA_NAME, "messages": weather_history(), "tools": WEATHER_TOOLS, "tool_choice": "required",
            "max_tokens": 40, "temperature": 0, "seed": 7, "stream": True}
    ours = [c.model_dump(exclude_none=True) for c in client.chat.completions.create(**body)]
    with httpx.stream("POST", engine_url(server) + "/v1/chat/completions", json=body, timeout=300) as resp:
        direct = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]

    def fragments(chunks):  # (index, name piece, arguments piece) in order; ids are random per request
        return [(f["index"], f.get("function", {}).get("name"), f.get("function", {}).get("arguments"))
                for c in chunks for ch in c.get("choices", []) for f in ch.get("delta", {}).get("tool_calls") or []]

    assert fragments(ours) == fragments(direct) and fragments(ours)
    calls: dict[int, dict] = {}
    for index, name, args in fragments(ours):
        call = calls.setdefault(index, {"name": "", "arguments": ""})
        call["name"] += name or ""
        call["arguments"] += args or ""
    assert list(calls) == [0] and calls[0]["name"] == "get_weather"
    assert "city" in json.loads(calls[0]["arguments"])
    first = next(f for c in ours for ch in c.get("choices", []) for f in ch.get("delta", {}).get("tool_calls") or [])
    assert first["id"] and first["type"] == "function" and first["function"]["name"] == "get_weather"

    def finish(chunks):
        return [ch["finish_reason"] for c in chunks for ch in c.get("choices", []) if ch.get("finish_reason")]

    assert finish(ours) == finish(direct) and finish(ours)[0] in ("tool_calls", "length")  # budget may end it


JOKE = [{"role": "user", "content": "Tell me a joke about cats."}]
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a city",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}


def test_named_tool_choice_is_called_even_without_an_example(client):
    """A tool named in tool_choice is called, as OpenAI promises. llama-server alone reads the object as
    "auto", and this 270M model, with nothing to imitate, tells the joke instead."""
    resp = client.chat.completions.create(
        model=GEMMA_NAME, messages=JOKE, tools=[TIME_TOOL, *WEATHER_TOOLS], max_tokens=60, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.id and call.type == "function" and call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    assert resp.usage.completion_tokens > 0


def test_named_tool_choice_streamed(client):
    """Streamed as OpenAI streams a forced call: id, type and name first, then the arguments in pieces."""
    stream = client.chat.completions.create(
        model=GEMMA_NAME, messages=JOKE, tools=[TIME_TOOL, *WEATHER_TOOLS], max_tokens=60, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True)
    chunks = [c for c in stream if c.choices]
    fragments = [f for c in chunks for f in c.choices[0].delta.tool_calls or []]
    assert fragments[0].id and fragments[0].type == "function" and fragments[0].function.name == "get_weather"
    assert all(f.index == 0 and f.id is None for f in fragments[1:]) and len(fragments) > 2
    assert not any(c.choices[0].delta.content for c in chunks)
    assert isinstance(json.loads("".join(f.function.arguments or "" for f in fragments))["city"], str)
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["tool_calls"]


@pytest.mark.parametrize(("choice", "says"), [
    ({"type": "function", "function": {"name": "get_tide"}}, "no function named 'get_tide'"),
    ({"type": "function"}, "must be"),
    ({"type": "allowed_tools"}, "must be"),
], ids=["not-offered", "no-name", "other-type"])
def test_bad_named_tool_choice_is_a_400(server, choice, says):
    body = {"model": GEMMA_NAME, "messages": JOKE, "tools": WEATHER_TOOLS, "tool_choice": choice}
    resp = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert says in err["message"] and err["param"] == "tool_choice" and err["type"] == "invalid_request_error"


def stated_context(server) -> int:
    """The context the server states for Gemma (the engine's own figure once it is loaded)."""
    with httpx.Client(base_url=server.url) as c:
        return c.get(f"/v1/models/{GEMMA_NAME}").json()["context_length"]


def too_long(server) -> str:
    """A prompt of more tokens than the stated context (one token per "hello")."""
    return "hello " * (stated_context(server) + 1000)


def engine_url(server) -> str:
    """The loaded model's llama-server, to ask it directly."""
    with httpx.Client(base_url=server.url) as c:
        return c.get("/v1/health").json()["all_models_loaded"][0]["backend_url"].removesuffix("/v1")


def keys(value):
    """The keys at every level of a JSON value (lists by their first item): which fields are present."""
    if isinstance(value, dict):
        return {k: keys(v) for k, v in value.items()}
    return [keys(value[0])] if isinstance(value, list) and value else type(value).__name__


def token_strings(choice: dict) -> list[str]:
    return [t["token"] for t in ((choice.get("logprobs") or {}).get("content") or [])]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 20, "logprobs": True, "top_logprobs": 2}),
    ("/v1/chat/completions", {"messages": weather_history(), "tools": WEATHER_TOOLS, "tool_choice": "required",
                              "max_tokens": 40}),
    ("/v1/completions", {"prompt": "The sky is", "max_tokens": 20, "logprobs": 2}),
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 24}),
], ids=["chat-logprobs", "chat-tool-call", "completion-logprobs", "completion"])
def test_non_streamed_answer_assembled_from_the_stream_matches_the_engines(server, path, body):
    """We ask llama-server for a stream and build the non-streamed answer (so a client that leaves
    stops the engine); it must be the answer llama-server itself gives to the same greedy request.
    (Every budget here is above SHORT_ANSWER_TOKENS, so each request really goes the streamed way.)"""
    # No prompt cache: with Gemma's full window cache (--swa-full) the second request would read only its
    # last prompt token from the first one's cache, and a batch of another shape can tip a near tie of
    # greedy decoding (llama-server does that to itself); this test is about the assembly, not the cache.
    body = {"model": GEMMA_NAME, **body, "temperature": 0, "seed": 7, "cache_prompt": False}
    ours = httpx.post(server.url + path, json=body, timeout=300).json()
    direct = httpx.post(engine_url(server) + path, json=body, timeout=300).json()
    assert keys(ours) == keys(direct), (ours, direct)
    assert ours["object"] == direct["object"] and ours["model"] == direct["model"]
    figures = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [ours["usage"][k] for k in figures] == [direct["usage"][k] for k in figures]
    assert ours["timings"]["predicted_n"] == direct["timings"]["predicted_n"] > 0
    mine, theirs = ours["choices"][0], direct["choices"][0]
    assert mine["finish_reason"] == theirs["finish_reason"] and token_strings(mine) == token_strings(theirs)
    if path == "/v1/completions":
        assert mine["text"] == theirs["text"]
        return
    assert mine["message"]["content"] == theirs["message"]["content"]
    calls = [(c["type"], c["function"]) for c in mine["message"].get("tool_calls", [])]
    assert calls == [(c["type"], c["function"]) for c in theirs["message"].get("tool_calls", [])]
    assert ("tools" in body) == bool(calls) and all(c["id"] for c in mine["message"].get("tool_calls", []))


def test_engine_error_of_a_non_streamed_request_keeps_its_status(server):
    """An error llama-server answers a (now streamed) request with reaches the client as before."""
    body = {"model": GEMMA_NAME, "prompt": too_long(server), "max_tokens": 100}
    direct = httpx.post(engine_url(server) + "/v1/completions", json=body, timeout=300)
    ours = httpx.post(server.url + "/v1/completions", json=body, timeout=300)
    assert direct.status_code == ours.status_code == 400
    error = ours.json()["error"]
    assert direct.json()["error"]["message"] in error["message"]
    # llama-server's own words for it become OpenAI's code, which clients test for (as Lemonade answers)
    assert (error["type"], error["code"], error["status_code"]) == ("invalid_request_error", "context_length_exceeded",
                                                                    400)


@pytest.mark.parametrize(("fields", "no_think"), [
    ({"thinking": False}, True),
    ({"thinking": {"type": "disabled"}}, True),
    ({"enable_thinking": False}, True),
    ({"enable_thinking": True, "thinking": False}, False),  # Lemonade's own field wins
    ({"thinking": True}, False),
])
def test_thinking_off_as_clients_send_it(server, fields, no_think):
    """`thinking: false` (OpenCode and other OpenAI-style clients) or Lemonade's `enable_thinking:
    false` turn thinking off for every engine and template: the engine gets `reasoning_effort:
    "none"`, the template's `enable_thinking: false` and `/no_think` before the last user message,
    and never the client's fields. Seen from the engine's own prompt count: `/no_think` adds its
    tokens exactly when thinking is turned off."""
    def prompt_tokens(extra: dict) -> int:
        body = {"model": GEMMA_NAME, "max_tokens": 1, "messages": [{"role": "user", "content": "Say hello."}], **extra}
        resp = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=300)
        assert resp.status_code == 200, resp.text
        return resp.json()["usage"]["prompt_tokens"]

    plain = prompt_tokens({})
    marked = prompt_tokens({"messages": [{"role": "user", "content": "/no_think\nSay hello."}]})
    assert marked > plain
    assert prompt_tokens(fields) == (marked if no_think else plain)


def test_completions_echo_and_logprobs(client):
    resp = client.completions.create(model=GEMMA_NAME, prompt="The sky is", max_tokens=5, echo=True, logprobs=2,
                                     temperature=0)
    assert resp.object == "text_completion"
    assert resp.choices[0].text.startswith("The sky is")
    assert resp.choices[0].logprobs is not None
    stream = client.completions.create(model=GEMMA_NAME, prompt="Once upon a time", max_tokens=6, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices)


def test_streamed_completion_of_several_prompts_is_openai_chunks_only(client):
    """llama-server opens such a stream with `data: null` (found by benchmarks/fuzz_api.py); the openai
    client must get chunks only, for every prompt."""
    stream = client.completions.create(model=GEMMA_NAME, prompt=["The sky is", "Once upon"], max_tokens=3,
                                       stream=True)
    chunks = list(stream)
    assert all(chunk is not None and chunk.object == "text_completion" for chunk in chunks)
    assert {choice.index for chunk in chunks for choice in chunk.choices} == {0, 1}


def test_responses_api(client):
    resp = client.responses.create(model=GEMMA_NAME, input="Say hello", max_output_tokens=16)
    assert resp.object == "response" and resp.output_text is not None
    resp = client.responses.create(model=GEMMA_NAME, max_output_tokens=16,
                                   input=[{"role": "user", "content": "Say hello"}])
    assert resp.output
    events = [e.type for e in client.responses.create(model=GEMMA_NAME, input="Hi", max_output_tokens=16,
                                                      stream=True)]
    assert events[0] == "response.created" and events[-1] == "response.completed"
    assert "response.output_text.delta" in events


def test_unknown_model_and_wrong_mode(server, client, tmp_path):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="No-Such-Model", messages=CHAT)
    assert err.value.body["code"] == "model_not_found"
    with httpx.Client(base_url=server.url) as c:
        resp = c.post("/v1/embeddings", json={"model": GEMMA_NAME, "input": "x"})
        assert resp.status_code == 400 and "/chat/completions" in resp.json()["error"]["message"]
        resp = c.post("/v1/chat/completions", json={"model": "Whisper-Tiny", "messages": CHAT})
        assert resp.status_code == 400 and "transcription" in resp.json()["error"]["message"]


@pytest.mark.parametrize("body,field", [
    ({"model": GEMMA_NAME, "messages": []}, "messages"),
    ({"model": GEMMA_NAME, "messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ({"model": GEMMA_NAME, "messages": CHAT, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"model": GEMMA_NAME, "messages": CHAT, "top_p": 3}, "top_p"),
    ({"model": GEMMA_NAME, "messages": CHAT, "stream": "yes"}, "stream"),
    ({"model": GEMMA_NAME, "messages": CHAT, "tools": [{"type": "function"}]}, "function"),
    ({"model": 5, "messages": CHAT}, "model"),
])
def test_chat_bad_inputs(server, body, field):
    with httpx.Client(base_url=server.url) as c:
        resp = c.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400 and field in resp.json()["error"]["message"]


def test_other_endpoints_bad_inputs(server):
    with httpx.Client(base_url=server.url) as c:
        assert c.post("/v1/completions", json={"model": GEMMA_NAME}).status_code == 400
        assert c.post("/v1/completions", json={"model": GEMMA_NAME, "prompt": "x", "stream": True,
                                               "logprobs": 1}).status_code == 400
        assert c.post("/v1/embeddings", json={"model": GEMMA_NAME, "input": []}).status_code == 400
        assert c.post("/v1/embeddings", json={"model": GEMMA_NAME, "input": "x",
                                              "encoding_format": "hex"}).status_code == 400
        assert c.post("/v1/responses", json={"model": GEMMA_NAME}).status_code == 400


def test_stats_and_metrics_after_requests(server, client):
    client.chat.completions.create(model=GEMMA_NAME, messages=CHAT, max_tokens=5)
    with httpx.Client(base_url=server.url) as c:
        stats = c.get("/v1/stats").json()
        assert stats["output_tokens"] >= 1 and stats["input_tokens"] >= 1
        assert stats["tokens_per_second"] > 0 and stats["time_to_first_token"] > 0
        assert stats["request_count_total"] >= 1 and stats["output_tokens_total"] >= stats["output_tokens"]
        metrics = c.get("/metrics").text
    assert f'lemonade_model_requests_total{{endpoint="chat/completions",model="{GEMMA_NAME}"}}' in metrics
    assert f'lemonade_model_tokens_total{{kind="output",model="{GEMMA_NAME}"}}' in metrics
    assert "lemonade_llamacpp_prompt_tokens_total" in metrics
    assert f'model="{GEMMA_NAME}"' in metrics.split("lemonade_llamacpp_prompt_tokens_total", 1)[1][:400]
    assert 'lemonade_models_loaded{type="llm"} 1.0' in metrics


def test_streaming_stats_recorded(server, client):
    with httpx.Client(base_url=server.url) as c:
        before = c.get("/v1/stats").json()["request_count_total"]
        list(client.chat.completions.create(model=GEMMA_NAME, messages=CHAT, max_tokens=5, stream=True))
        assert c.get("/v1/stats").json()["request_count_total"] == before + 1


# ----- llama.cpp endpoints ---------------------------------------------------------------------

def test_tokenize_and_slots(server, client):
    client.chat.completions.create(model=GEMMA_NAME, messages=CHAT, max_tokens=2)
    with httpx.Client(base_url=server.url) as c:
        toks = c.post("/v1/tokenize", json={"content": "Hello world"}).json()["tokens"]
        assert toks and all(isinstance(t, int) for t in toks)
        pieces = c.post("/v1/tokenize", json={"content": "Hello", "with_pieces": True}).json()["tokens"]
        assert {"id", "piece"} <= set(pieces[0])
        assert c.post("/v1/tokenize", json={"content": 5}).status_code == 400
        assert c.post("/v1/tokenize", json={}).status_code == 400
        slots = c.get("/v1/slots").json()
        assert isinstance(slots, list) and "n_ctx" in slots[0]
        resp = c.post("/v1/slots/0?action=erase")  # works: every engine gets a slot folder of ours
        assert resp.status_code == 200 and resp.json()["id_slot"] == 0, resp.text
        traversal = c.post("/v1/slots/0?action=save", json={"filename": "../escape.bin"})
        assert traversal.status_code == 400, traversal.text  # the engine refuses paths in file names
        assert c.post("/v1/slots/0?action=nope").status_code == 400
        assert c.post("/v1/slots/0").status_code == 400
        assert c.post("/v1/slots/99999999999?action=erase").status_code == 400
        assert c.post("/v1/slots/0?action=save", json={}).status_code == 400


def test_slot_save_restore(make_server, gemma_dir, tmp_path):
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    saves = srv.cache / "slots" / GEMMA_ID  # ours (by canonical id): a request cannot point the engine at a folder
    with srv.client() as c:
        assert c.post("/v1/slots/0?action=erase").status_code == 400  # no model loaded yet
        refused = c.post("/v1/load", json={"model_name": GEMMA_NAME, "llamacpp_args": f"--slot-save-path {tmp_path}"})
        assert refused.status_code == 400 and "'--slot-save-path'" in refused.json()["error"]["message"]
        assert c.post("/v1/load", json={"model_name": GEMMA_NAME, "llamacpp_args": "-np 1"}).status_code == 200
        c.post("/v1/chat/completions", json={"model": GEMMA_NAME, "messages": CHAT, "max_tokens": 2})
        saved = c.post("/v1/slots/0?action=save", json={"filename": "conv.bin"})
        assert saved.status_code == 200, saved.text
        assert saved.json()["n_saved"] > 0 and (saves / "conv.bin").exists()
        restored = c.post("/v1/slots/0?action=restore", json={"filename": "conv.bin"}).json()
        assert restored["n_restored"] == saved.json()["n_saved"]
        assert c.post("/v1/slots/0?action=erase").json()["id_slot"] == 0
        # A folder of the user's choice for one load (llamacpp-newer.md): inside the server's slot folder.
        mine = c.post("/v1/load", json={"model_name": GEMMA_NAME, "llamacpp_args": "-np 1 --slot-save-path team"})
        assert mine.status_code == 200, mine.text
        c.post("/v1/chat/completions", json={"model": GEMMA_NAME, "messages": CHAT, "max_tokens": 2})
        assert c.post("/v1/slots/0?action=save", json={"filename": "t.bin"}).status_code == 200
        assert (srv.cache / "slots" / "team" / "t.bin").exists()


def test_spec_engine_flags_work_per_load_and_paths_stay_refused(server):
    """The spec's own examples (`--no-mmap`, `--mlock`, llamacpp.md/api-lemonade.md) and partial offload
    (`-ngl 20`) load, translated to the pinned build's `--load-mode`; a flag that names a file, a folder
    or a network address is refused before anything starts."""
    with server.client() as c:
        for args, expected in (("--flash-attn on --no-mmap", ["--load-mode", "none"]),
                               ("--no-context-shift --mlock", ["--load-mode", "mmap+mlock"]),
                               ("-ngl 20", ["-ngl", "20"])):
            resp = c.post("/v1/load", json={"model_name": GEMMA_NAME, "llamacpp_args": args})
            assert resp.status_code == 200, resp.text
            (entry,) = c.get("/v1/health").json()["all_models_loaded"]
            command = " ".join(entry["launch_command"])
            assert " ".join(expected) in command, command
            answer = c.post("/v1/chat/completions", json={"model": GEMMA_NAME, "messages": CHAT, "max_tokens": 4})
            assert answer.status_code == 200, answer.text
        for args, says in (("--lora adapter.gguf", "file or folder"), ("--log-file /tmp/x.log", "file or folder"),
                           ("-hf owner/repo", "network address"), ("--tools all", "file or folder"),
                           ("--slot-save-path /etc", "inside the server's slot folder")):
            resp = c.post("/v1/load", json={"model_name": GEMMA_NAME, "llamacpp_args": args})
            assert resp.status_code == 400 and says in resp.json()["error"]["message"], (args, resp.text)


def test_a_saved_option_is_checked_when_saved_and_never_dropped_at_load(make_server, gemma_dir):
    """recipe_options.json written by an older version may hold a flag today's rule refuses: the load
    says so (400, naming the option and how to clear it) instead of loading without the user's setting."""
    cache_seed = make_server.tmp.mktemp("saved-options")
    config_dir = cache_seed.with_name(cache_seed.name + "-config")  # the harness's config dir for this cache
    config_dir.mkdir()
    (config_dir / "recipe_options.json").write_text(json.dumps({GEMMA_ID: {"llamacpp_args": "--log-file /tmp/x"}}))
    srv = make_server(cache=cache_seed, env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    url = f"/v1/models/{GEMMA_NAME}/options"
    with srv.client() as c:
        refused = c.post("/v1/load", json={"model_name": GEMMA_NAME})
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "invalid_saved_option" and "llamacpp_args" in error["message"]
        assert f"POST /v1/models/{GEMMA_ID}/options" in error["message"]
        auto = c.post("/v1/chat/completions", json={"model": GEMMA_NAME, "messages": CHAT, "max_tokens": 2})
        assert auto.status_code == 400 and "llamacpp_args" in auto.json()["error"]["message"]  # auto-load too
        # This request's own value stands in for the saved one.
        assert c.post("/v1/load", json={"model_name": GEMMA_NAME, "llamacpp_args": "-t 1"}).status_code == 200
        assert c.post(url, json={"llamacpp_args": "--log-file /tmp/y"}).status_code == 400  # checked when saved
        assert c.post(url, json={"llamacpp_args": None}).status_code == 200  # cleared: loads as usual
        assert c.post("/v1/load", json={"model_name": GEMMA_NAME}).status_code == 200


def test_tokenize_without_model_is_400(make_server):
    srv = make_server()
    with srv.client() as c:
        resp = c.post("/v1/tokenize", json={"content": "x"})
        assert resp.status_code == 400 and "No model is loaded" in resp.json()["error"]["message"]
        assert c.get("/v1/slots").status_code == 400


# ----- load, unload, options -------------------------------------------------------------------

def test_load_options_and_health_fields(make_server, gemma_dir):
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    with srv.client() as c:
        resp = c.post("/v1/load", json={"model_name": GEMMA_NAME, "ctx_size": 1024, "pinned": True})
        # as Lemonade answers it, plus the context the engine really gives; no key is set, so the caller
        # is the admin and sees the extra-dir file by its path
        assert resp.json() == {"status": "success", "message": f"Loaded model: {GEMMA_NAME}",
                               "model_name": GEMMA_NAME, "recipe": "llamacpp",
                               "checkpoint": str(gemma_dir / f"{GEMMA_NAME}.gguf"),
                               "context_length": 1024, "context_reason": "ctx_size 1024 as configured"}
        health = c.get("/v1/health").json()
        assert health["model_loaded"] == GEMMA_NAME and health["pinned_models"]["llm"] == 1
        (m,) = health["all_models_loaded"]
        for key in ("model_name", "checkpoint", "last_use", "type", "device", "pinned", "is_busy", "is_streaming",
                    "recipe", "pid", "recipe_options", "backend_url"):
            assert key in m, key
        assert m["pinned"] and m["type"] == "llm" and m["recipe_options"]["ctx_size"] == 1024
        assert psutil.pid_exists(m["pid"]) and m["backend_url"].startswith("http://127.0.0.1:")
        slots = c.get("/v1/slots").json()
        assert slots[0]["n_ctx"] <= 1024  # the context size reached llama-server
        assert c.post("/v1/unload", json={"model_name": "nope"}).status_code == 404
        assert c.post("/v1/unload", json={"model_name": GEMMA_NAME}).json()["status"] == "success"
        wait_for(lambda: not psutil.pid_exists(m["pid"]) or psutil.Process(m["pid"]).status() == "zombie")
        assert c.get("/v1/health").json()["all_models_loaded"] == []
        c.post("/v1/load", json={"model_name": GEMMA_NAME})
        assert c.post("/v1/unload").json()["status"] == "success"  # no body: unload all
        assert c.get("/v1/health").json()["all_models_loaded"] == []


@pytest.mark.parametrize("body,needle", [
    ({"model_name": GEMMA_NAME, "llamacpp_args": "--port 1"}, "--port"),
    ({"model_name": GEMMA_NAME, "llamacpp_args": "-m other.gguf"}, "-m"),
    ({"model_name": GEMMA_NAME, "llamacpp_args": "--mmproj x"}, "--mmproj"),
    ({"model_name": GEMMA_NAME, "ctx_size": "big"}, "ctx_size"),
    ({"model_name": GEMMA_NAME, "ctx_size": 0}, "ctx_size"),
    ({"model_name": GEMMA_NAME, "steps": 3}, "steps"),
    ({"model_name": GEMMA_NAME, "bogus": 1}, "bogus"),
    ({"model_name": GEMMA_NAME, "pinned": "yes"}, "pinned"),
    ({"model_name": "No-Such-Model"}, "No-Such-Model"),
    ({}, "model_name"),
])
def test_load_bad_inputs(server, body, needle):
    with httpx.Client(base_url=server.url) as c:
        resp = c.post("/v1/load", json=body)
    assert resp.status_code in (400, 404) and needle in resp.json()["error"]["message"]


def test_options_endpoints(make_server, gemma_dir):
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)}, config={"llamacpp": {"args": "--threads 2"}})
    path = srv.config_dir / "recipe_options.json"
    url = f"/v1/models/{GEMMA_NAME}/options"
    with srv.client() as c:
        view = c.get(url).json()
        assert view["saved"] == {} and view["recipe"] == "llamacpp" and view["model_name"] == GEMMA_NAME
        trained = gguf_info(gemma_dir / f"{GEMMA_NAME}.gguf").context_length
        # automatic: as much as the free memory holds, up to the trained length (test_context.py: exactly)
        assert view["effective"]["ctx_size"] == -1 and 4096 <= view["resolved_ctx_size"] <= trained
        # the admin's flags over this machine's auto-tune profile, if it has one
        admin = " ".join(filter(None, [tuned_args(), "--threads 2"]))
        assert view["effective"]["llamacpp_args"] == admin
        assert view["effective"]["model_name"] == GEMMA_NAME
        assert view["load_command"].startswith("curl -X POST $LEMONADE_BASE_URL/v1/load")
        dry = c.post(url, json={"ctx_size": 2048, "dry_run": True}).json()
        assert dry["effective"]["ctx_size"] == 2048 and dry["saved"] == {} and not path.exists()
        saved = c.post(url, json={"ctx_size": 2048, "llamacpp_args": "-b 256"}).json()
        assert saved["saved"] == {"ctx_size": 2048, "llamacpp_args": "-b 256"}
        assert saved["effective"]["llamacpp_args"] == admin + " -b 256"  # merge_args
        assert json.loads(path.read_text())[GEMMA_ID] == saved["saved"]
        assert c.post(url, json={"ctx_size": None}).json()["saved"] == {"llamacpp_args": "-b 256"}
        before = path.read_bytes()
        for bad in ({"ctx_size": -5}, {"whispercpp_args": "x"}, {"nope": 1}, {"llamacpp_args": "--jinja"}):
            resp = c.post(url, json=bad)
            assert resp.status_code == 400, bad
        assert path.read_bytes() == before
        # a load uses the saved options; an explicit null skips the saved value for that load only
        c.post("/v1/load", json={"model_name": GEMMA_NAME, "llamacpp_args": None})
        opts = c.get("/v1/health").json()["all_models_loaded"][0]["recipe_options"]
        assert opts["llamacpp_args"] == admin
        assert json.loads(path.read_text())[GEMMA_ID] == {"llamacpp_args": "-b 256"}
        c.post("/v1/load", json={"model_name": GEMMA_NAME, "ctx_size": 1536, "save_options": True})
        assert json.loads(path.read_text())[GEMMA_ID] == {"ctx_size": 1536}
        reset = c.delete(url).json()
        assert reset["saved"] == {} and GEMMA_NAME not in json.loads(path.read_text())
        assert c.get("/v1/models/nope/options").status_code == 404


# ----- residency -------------------------------------------------------------------------------

@pytest.fixture
def two_models(tmp_path, gemma_dir):
    root = tmp_path / "extra"
    for name in ("g1", "g2"):
        (root / name).mkdir(parents=True)
        (root / name / "model.gguf").symlink_to(gemma_dir / "gemma-3-270m-q4_k_m.gguf")
    return root


def chat(c, model, n=3):
    resp = c.post("/v1/chat/completions", json={"model": model, "messages": CHAT, "max_tokens": n})
    assert resp.status_code == 200, resp.text
    return resp


def loaded(c):
    return [m["model_name"] for m in c.get("/v1/health").json()["all_models_loaded"]]


def test_lru_eviction_and_pinning(make_server, two_models, tmp_path):
    write_gguf(two_models / "g3" / "model.gguf")  # never loaded: only its name is used
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(two_models)})
    with srv.client() as c:
        chat(c, "g1")
        chat(c, "g2")
        assert loaded(c) == ["g2"]  # limit 1: g1 was evicted
        c.post("/internal/set", json={"max_loaded_models": 2})
        chat(c, "g1")
        assert sorted(loaded(c)) == ["g1", "g2"]
        c.post("/internal/set", json={"max_loaded_models": 1})
        c.post("/v1/load", json={"model_name": "g2", "pinned": True})
        c.post("/v1/unload", json={"model_name": "g1"})
        resp = c.post("/v1/chat/completions", json={"model": "g1", "messages": CHAT, "max_tokens": 2})
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "slots_pinned_error"
        assert loaded(c) == ["g2"]
        resp = c.post("/v1/load", json={"model_name": "g1"})
        assert resp.status_code == 409


def test_alias_switches_traffic(make_server, two_models):
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(two_models)}, config={"max_loaded_models": 2})
    with srv.client() as c:
        c.post("/internal/aliases", json={"alias": "prod", "target": "g1"})
        assert chat(c, "prod").json()["model"] == "g1"
        c.post("/internal/aliases", json={"alias": "prod", "target": "g2"})
        assert chat(c, "prod").json()["model"] == "g2"


def test_concurrent_first_requests_cause_one_load(make_server, gemma_dir):
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    results = []

    def worker():
        with srv.client() as c:
            results.append(c.post("/v1/chat/completions", json={"model": GEMMA_NAME, "messages": CHAT,
                                                                "max_tokens": 3}).status_code)
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200] * 4
    assert srv.log().count("Starting: ") == 1


def test_busy_model_is_not_evicted_mid_stream(make_server, two_models):
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(two_models)})
    with srv.client() as c:
        chat(c, "g1")
        with c.stream("POST", "/v1/chat/completions", json={"model": "g1", "messages": CHAT,
                                                           "max_tokens": 60, "stream": True,
                                                           "ignore_eos": True}) as stream:
            lines = stream.iter_lines()
            next(lines)
            box = {}
            loader = threading.Thread(target=lambda: box.setdefault("r", chat(srv.client(), "g2")))
            loader.start()
            time.sleep(0.5)
            assert loaded(c) == [] or "g2" not in loaded(c)  # still waiting for g1's stream
            rest = list(lines)
        assert any(line.startswith("data: [DONE]") for line in rest)  # the stream finished, uncut
        loader.join(60)
        assert box["r"].status_code == 200 and loaded(c) == ["g2"]


def test_engine_crash_is_reported_and_recovered(make_server, gemma_dir):
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    with srv.client() as c:
        chat(c, GEMMA_NAME)
        pid = c.get("/v1/health").json()["all_models_loaded"][0]["pid"]
        os.kill(pid, signal.SIGKILL)
        health = wait_for(lambda: (h := c.get("/v1/health").json())["crashed_models"] and h)
        assert health["crashed_models"][0]["model_name"] == GEMMA_NAME
        assert health["crashed_models"][0]["exit_code"] == -9
        chat(c, GEMMA_NAME)  # the next request starts it again
        health = c.get("/v1/health").json()
        assert health["crashed_models"] == [] and health["all_models_loaded"][0]["pid"] != pid


def test_engine_death_mid_stream_gives_sse_error(make_server, gemma_dir):
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    with srv.client() as c:
        chat(c, GEMMA_NAME)
        pid = c.get("/v1/health").json()["all_models_loaded"][0]["pid"]
        with c.stream("POST", "/v1/chat/completions", json={"model": GEMMA_NAME, "messages": CHAT,
                                                           "max_tokens": 500, "stream": True,
                                                           "ignore_eos": True}) as stream:
            lines = stream.iter_lines()
            next(lines)
            os.kill(pid, signal.SIGKILL)
            rest = list(lines)
        assert "event: error" in rest
        err = json.loads(next(line for line in rest if line.startswith("data:") and "error" in line)[5:])
        assert "exited" in err["error"]["message"] or "connection" in err["error"]["message"]
        chat(c, GEMMA_NAME)  # the next request is served by a new engine; the killed one is reaped, no zombie
        assert c.get("/v1/health").json()["all_models_loaded"][0]["pid"] != pid
        wait_for(lambda: not psutil.pid_exists(pid), timeout=10)


LONG_PROMPT = [{"role": "user", "content": "lemon " * 3000 + "\nHow many lemons?"}]  # seconds of prompt work


def processing(c) -> bool:
    return any(s.get("is_processing") for s in c.get("/v1/slots").json())


def test_engine_death_before_the_first_token_is_retried(make_server, gemma_dir):
    """Our response starts with the engine's first chunk, so an engine that dies while it reads the
    prompt has sent nothing the client saw: it is started again and the stream comes from the new one."""
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    with srv.client() as c:
        chat(c, GEMMA_NAME)
        pid = c.get("/v1/health").json()["all_models_loaded"][0]["pid"]
        box: dict = {}

        def ask() -> None:
            with srv.client() as own, own.stream("POST", "/v1/chat/completions", timeout=300, json={
                    "model": GEMMA_NAME, "messages": LONG_PROMPT, "max_tokens": 8, "stream": True}) as resp:
                box["status"], box["lines"] = resp.status_code, list(resp.iter_lines())

        asker = threading.Thread(target=ask)
        asker.start()
        wait_for(lambda: processing(c), timeout=30, interval=0.02)
        os.kill(pid, signal.SIGKILL)
        asker.join(300)
        assert box["status"] == 200 and "event: error" not in box["lines"], box
        events = [json.loads(line[6:]) for line in box["lines"] if line.startswith("data: {")]
        assert any(e["choices"] and e["choices"][0]["delta"].get("content") for e in events)
        assert box["lines"][-1] == "data: [DONE]" or "data: [DONE]" in box["lines"]
        assert c.get("/v1/health").json()["all_models_loaded"][0]["pid"] != pid


def test_client_gone_before_the_first_token_stops_the_engine(make_server, gemma_dir):
    """A client that hangs up while the engine reads its prompt (no byte of the answer sent yet)
    stops the engine's work: the slot is free long before 2000 tokens could have been made."""
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    with srv.client() as c:
        chat(c, GEMMA_NAME)

        def ask() -> None:
            with contextlib.suppress(httpx.TimeoutException):
                srv.client().post("/v1/chat/completions", timeout=0.5, json={
                    "model": GEMMA_NAME, "messages": LONG_PROMPT, "max_tokens": 2000, "stream": True,
                    "ignore_eos": True})

        asker = threading.Thread(target=ask)
        asker.start()
        wait_for(lambda: processing(c), timeout=30, interval=0.02)
        busy = next(s["id"] for s in c.get("/v1/slots").json() if s.get("is_processing"))
        asker.join(30)  # the client gave up (0.5 s timeout) and closed its connection
        # The prompt's batch in progress is not interrupted (on a busy CPU it takes tens of seconds), so
        # the proof is what the slot did, not how soon: it stopped without generating the 2000 tokens.
        wait_for(lambda: not processing(c), timeout=300, interval=SLOTS_POLL_AFTER_HANGUP)
        slot = next(s for s in c.get("/v1/slots").json() if s["id"] == busy)
        assert slot["next_token"][0]["n_decoded"] < 100, slot["next_token"]
        health = c.get("/v1/health").json()["all_models_loaded"][0]
        assert not health["is_busy"] and not health["is_streaming"]


def test_client_disconnect_cancels_generation(make_server, gemma_dir):
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    with srv.client() as c:
        chat(c, GEMMA_NAME)
        with c.stream("POST", "/v1/chat/completions", json={"model": GEMMA_NAME, "messages": CHAT,
                                                           "max_tokens": 2000, "stream": True,
                                                           "ignore_eos": True}) as stream:
            lines = stream.iter_lines()
            next(lines)
            next(lines)
        # the engine stops generating: its slot goes idle long before 2000 tokens could be produced
        wait_for(lambda: not any(s["is_processing"] for s in c.get("/v1/slots").json()), timeout=20)
        health = c.get("/v1/health").json()["all_models_loaded"][0]
        assert not health["is_busy"] and not health["is_streaming"]


def test_shutdown_stops_engines(make_server, gemma_dir):
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    with srv.client() as c:
        chat(c, GEMMA_NAME)
        pids = srv.engine_pids()
    assert pids
    assert srv.stop(signal.SIGTERM) == 0
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_server_killed_hard_takes_engines_with_it(make_server, gemma_dir):
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    with srv.client() as c:
        chat(c, GEMMA_NAME)
    pids = srv.engine_pids()
    os.kill(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait(10)
    wait_for(lambda: all(not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE
                         for p in pids), timeout=10)


# ----- backends --------------------------------------------------------------------------------

def test_install_endpoint_is_noop_when_installed_and_validates(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        resp = c.post("/v1/install", json={"recipe": "llamacpp", "backend": "cpu"})
        assert resp.status_code == 200 and resp.json()["status"] == "success"
        with c.stream("POST", "/v1/install", json={"recipe": "llamacpp", "backend": "cpu", "stream": True}) as s:
            events = [line for line in s.iter_lines() if line.startswith("event:")]
        assert events[-1] == "event: complete"
        # Lemonade's app: a server-owned install job, answered at once and listed with the downloads
        job = c.post("/v1/install", json={"recipe": "llamacpp", "backend": "cpu", "stream": True, "subscribe": False})
        assert job.status_code == 200 and job.headers["content-type"].startswith("application/json"), job.text
        assert job.json()["id"] == "backend:llamacpp:cpu" and job.json()["type"] == "backend"
        listed = wait_for(lambda: next((j for j in c.get("/v1/downloads").json()
                                        if j["id"] == "backend:llamacpp:cpu" and not j["running"]), None), timeout=60)
        assert listed["status"] == "completed" and listed["complete"] and listed["model_name"] == "llamacpp:cpu"
        assert c.post("/v1/downloads/control", json={"id": "backend:llamacpp:cpu", "action": "remove"}).json() == \
            {"status": "ok"}
        assert all(j["id"] != "backend:llamacpp:cpu" for j in c.get("/v1/downloads").json())
        for body in ({"recipe": "llamacpp", "backend": "vulkan"}, {"recipe": "nope", "backend": "cpu"},
                     {"recipe": "llamacpp"}, {"recipe": "llamacpp", "backend": "cpu", "stream": "x"}):
            assert c.post("/v1/install", json=body).status_code == 400, body
        missing = c.post("/v1/install", json={"backend": "cpu"}).json()["error"]
        assert missing["code"] == "missing_argument" and "'recipe'" in missing["message"]
        stray = c.post("/v1/install", json={"recipe": "llamacpp", "backend": "cpu", "provider": "x"}).json()["error"]
        assert "'provider'" in stray["message"]
        # the spec's cloud-shaped bodies (no 'recipe') go to the cloud engine (tests/test_cloud.py)
        resp = c.post("/v1/uninstall", json={"backend": "cloud", "provider": "fireworks"})
        assert resp.status_code == 404 and "fireworks" in resp.json()["error"]["message"]


def test_uninstall_unloads_models_first(make_server, gemma_dir, llama_backend, tmp_path):
    import shutil

    cache = tmp_path / "cache"
    shutil.copytree(llama_backend, cache / "backends" / "llamacpp" / "cpu")
    srv = make_server(cache=cache, env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    with srv.client() as c:
        chat(c, GEMMA_NAME)
        resp = c.post("/v1/uninstall", json={"recipe": "llamacpp", "backend": "cpu"})
        assert resp.json()["status"] == "success"
        assert loaded(c) == []
        assert not (cache / "backends" / "llamacpp" / "cpu").exists()
        info = c.get("/v1/system-info").json()["recipes"]["llamacpp"]["backends"]["cpu"]
        assert info["state"] == "installable" and "lemonade backends install" in info["action"]
        # online, the next request would install the backend again (install on first use); offline it
        # is refused at once, naming the backend and the command to run
        assert c.post("/internal/set", json={"offline": True}).status_code == 200
        resp = c.post("/v1/chat/completions", json={"model": GEMMA_NAME, "messages": CHAT})
        error = resp.json()["error"]
        assert resp.status_code == 400 and error["code"] == "backend_not_installed", error
        assert "lemonade backends install llamacpp:cpu" in error["message"]
        assert not (cache / "backends" / "llamacpp" / "cpu").exists()


def test_engine_output_reaches_log_stream(server, client):
    import websockets.sync.client as ws_client

    client.chat.completions.create(model=GEMMA_NAME, messages=CHAT, max_tokens=2)
    with ws_client.connect(server.url.replace("http", "ws") + "/logs/stream") as ws:
        ws.send(json.dumps({"type": "logs.subscribe", "after_seq": None}))
        entries = json.loads(ws.recv(timeout=5))["entries"]
    tags = {e["tag"] for e in entries}
    assert f"engine.llama-server:{GEMMA_NAME}" in tags and f"llama-server:{GEMMA_NAME}" in tags


def test_image_parts_need_a_vision_model(client):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=GEMMA_NAME, max_tokens=2, messages=[
            {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}])
    assert "does not accept images" in str(err.value)


@pytest.mark.parametrize("stream", [False, True])
def test_request_right_after_engine_death_is_answered(make_server, gemma_dir, stream):
    """No wait for the crash to be noticed: the request finds the engine dead, restarts it, and succeeds."""
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    with srv.client() as c:
        chat(c, GEMMA_NAME)
        pid = c.get("/v1/health").json()["all_models_loaded"][0]["pid"]
        os.kill(pid, signal.SIGKILL)
        resp = c.post("/v1/chat/completions", json={"model": GEMMA_NAME, "messages": CHAT, "max_tokens": 3,
                                                    "stream": stream})
        assert resp.status_code == 200, resp.text
        assert c.get("/v1/health").json()["all_models_loaded"][0]["pid"] != pid


def test_request_right_after_a_stream_is_answered(server):
    """llama-server closes the connection after a stream; the next request must not reuse it (was a 502)."""
    with httpx.Client(base_url=server.url, timeout=120) as c:
        for _ in range(15):
            with c.stream("POST", "/v1/chat/completions", json={"model": GEMMA_NAME, "messages": CHAT,
                                                               "max_tokens": 2, "stream": True}) as s:
                assert s.status_code == 200
                list(s.iter_lines())
            resp = c.post("/v1/tokenize", json={"content": "hi"})
            assert resp.status_code == 200, resp.text
            assert chat(c, GEMMA_NAME, n=1).status_code == 200


def test_short_requests_keep_one_connection_to_the_engine(server):
    """JSON round trips go over one kept-alive connection (runtime/engine_client.py): a connect per
    request would cost every `max_tokens=1` request its own TCP handshake."""
    with httpx.Client(base_url=server.url, timeout=120) as c:
        assert chat(c, GEMMA_NAME, n=1).status_code == 200
        engine_port = int(c.get("/v1/health").json()["all_models_loaded"][0]["backend_url"].rsplit(":", 1)[1]
                          .split("/")[0])

        def to_engine() -> set[int]:
            return {conn.laddr.port for conn in psutil.Process(server.proc.pid).net_connections("tcp")
                    if conn.raddr and conn.raddr.port == engine_port and conn.status == psutil.CONN_ESTABLISHED}

        first = to_engine()
        for _ in range(5):
            assert chat(c, GEMMA_NAME, n=1).status_code == 200
            assert c.post("/v1/tokenize", json={"content": "hi"}).status_code == 200
        assert len(first) == 1 and to_engine() == first


def test_system_backend_and_prefer_system(make_server, gemma_dir, llama_backend, tmp_path):
    """`llamacpp_backend: system` and `llamacpp.prefer_system` use the llama-server found on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "llama-server").symlink_to(llama_backend / "llama-server")
    path = f"{bin_dir}:{os.environ['PATH']}"
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir), "PATH": path})
    with srv.client() as c:
        info = c.get("/v1/system-info").json()["recipes"]["llamacpp"]["backends"]["system"]
        assert info["state"] == "installed" and info["version"]
        assert c.post("/v1/load", json={"model_name": GEMMA_NAME, "llamacpp_backend": "system"}).status_code == 200
        assert c.get("/v1/health").json()["all_models_loaded"][0]["backend"] == "system"
        c.post("/v1/unload")
        c.post("/internal/set", json={"llamacpp": {"prefer_system": True}})
        chat(c, GEMMA_NAME)
        assert c.get("/v1/health").json()["all_models_loaded"][0]["backend"] == "system"
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir), "PATH": "/usr/bin:/bin"})
    with srv.client() as c:
        resp = c.post("/v1/load", json={"model_name": GEMMA_NAME, "llamacpp_backend": "system"})
        assert resp.status_code == 400 and "llama-server not found on PATH" in resp.json()["error"]["message"]


def test_model_of_an_unavailable_engine_is_refused_before_any_download(make_server):
    srv = make_server(env={"LEMONADE_OFFLINE": "1"})
    with srv.client() as c:
        registered = c.post("/v1/models/register", json={"model_name": "user.npu-llm", "recipe": "flm",
                                                          "checkpoint": "amd/Llama-3.2-1B-FLM:main"})
        assert registered.status_code == 200, registered.text
        resp = c.post("/v1/load", json={"model_name": "user.npu-llm"})  # flm: no engine in this build
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "model_load_refused"


def test_paths_of_the_users_files_for_admins(server):
    """An extra-dir model's checkpoint is its absolute path, as Lemonade shows it, to admins: on a
    server without a key, every client (test_foundation.py has the keyed case, where others get the
    file name). Ollama's `show` never names the user's folders."""
    with httpx.Client(base_url=server.url) as c:
        full = c.get(f"/v1/models/{GEMMA_NAME}").json()["checkpoint"]
        assert os.path.isabs(full) and full.endswith("gemma-3-270m-q4_k_m.gguf")
        listed = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
        assert listed[GEMMA_NAME]["checkpoint"] == full
        show = c.post("/api/show", json={"model": GEMMA_NAME}).json()
        assert "FROM gemma-3-270m-q4_k_m.gguf" in show["modelfile"] and full not in json.dumps(show)


def test_ollama_style_latest_tag_on_every_family(server, client):
    """`MODEL:latest` (what Ollama users type) is MODEL on the OpenAI and Anthropic APIs too."""
    tagged = GEMMA_NAME + ":latest"
    reply = client.chat.completions.create(model=tagged, messages=CHAT, max_tokens=2)
    assert reply.choices[0].message.content is not None
    chunks = list(client.chat.completions.create(model=tagged, messages=CHAT, max_tokens=2, stream=True))
    assert chunks and chunks[-1].choices[0].finish_reason is not None
    with httpx.Client(base_url=server.url) as c:
        assert c.get(f"/v1/models/{tagged}").json()["id"] == GEMMA_NAME
        msg = c.post("/v1/messages", json={"model": tagged, "max_tokens": 2, "messages": CHAT})
        assert msg.status_code == 200, msg.text
        assert c.get("/v1/models/No-Such-Model:latest").status_code == 404


def test_context_length_is_what_the_model_gets(make_server, gemma_dir):
    """current/api-openai.md: the loaded value while running, else the configured ctx_size, with
    automatic sizing resolved (never -1)."""
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    with srv.client() as c:
        def context() -> int:
            return c.get(f"/v1/models/{GEMMA_NAME}").json()["context_length"]

        # automatic: the trained length, as this machine's free memory holds far more (test_context.py
        # checks the sizing against the free memory)
        assert context() == gguf_info(gemma_dir / f"{GEMMA_NAME}.gguf").context_length
        assert c.post("/internal/set", json={"ctx_size": 4096}).status_code == 200
        assert context() == 4096
        assert c.post("/v1/load", json={"model_name": GEMMA_NAME, "ctx_size": 2048}).status_code == 200
        assert context() == 2048
        listed = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
        assert listed[GEMMA_NAME]["context_length"] == 2048


def test_engine_errors_of_a_stream_arrive_as_stream_events(server, client):
    """A client that asked for a stream reads the engine's refusal (here: a prompt longer than the
    context) as its API's own error event, not as a JSON body an SSE parser skips."""
    long = too_long(server)
    with pytest.raises(openai.APIError) as err:  # the official client raises on the error event
        list(client.chat.completions.create(model=GEMMA_NAME, messages=[{"role": "user", "content": long}],
                                            max_tokens=2, stream=True))
    assert "context" in str(err.value.message)
    with httpx.Client(base_url=server.url, timeout=300) as c:
        oai = c.post("/v1/completions", json={"model": GEMMA_NAME, "prompt": long, "max_tokens": 2, "stream": True})
        assert oai.headers["content-type"].startswith("text/event-stream")
        event, data = oai.text.strip().split("\n", 1)
        assert event == "event: error" and "context" in json.loads(data.removeprefix("data: "))["error"]["message"]
        anthropic = c.post("/v1/messages", json={"model": GEMMA_NAME, "max_tokens": 2, "stream": True,
                                                 "messages": [{"role": "user", "content": long}]})
        assert anthropic.headers["content-type"].startswith("text/event-stream")
        last = anthropic.text.strip().split("\n\n")[-1].split("\n")
        assert last[0] == "event: error"
        assert json.loads(last[1].removeprefix("data: "))["type"] == "error"
        ollama_lines = c.post("/api/chat", json={"model": GEMMA_NAME, "messages": [{"role": "user", "content": long}],
                                                 "options": {"num_predict": 2}}).text.strip().splitlines()
        assert "context" in json.loads(ollama_lines[-1])["error"]


def test_a_prompt_that_cannot_fit_is_refused_before_the_engine(server, client):
    """Tens of MB of text would keep llama-server tokenizing for minutes before its own refusal; our
    code (not the engine's backend_error) shows the request never reached it."""
    huge = "x" * (stated_context(server) * 256 + 1)  # more characters than the context's tokens can hold
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=GEMMA_NAME, messages=[{"role": "user", "content": huge}], max_tokens=1)
    assert err.value.code == "context_length_exceeded" and "ctx_size" in str(err.value.message)
    with pytest.raises(openai.APIError, match="cannot fit"):  # streamed: an error event, as for the engine's own
        list(client.completions.create(model=GEMMA_NAME, prompt=huge, max_tokens=1, stream=True))
    assert client.chat.completions.create(model=GEMMA_NAME, messages=CHAT, max_tokens=1).choices


def test_a_lone_surrogate_is_a_400_not_an_engine_500(server):
    """JSON can spell "\\ud800", which is no character; the engine would fail on it with a 500."""
    def body(text: str) -> bytes:  # `text` is JSON source: escapes stay escapes
        head = json.dumps({"model": GEMMA_NAME, "max_tokens": 1})[:-1]
        return (head + ', "messages": [{"role": "user", "content": "' + text + '"}]}').encode()

    with httpx.Client(base_url=server.url, timeout=300, headers={"Content-Type": "application/json"}) as c:
        for path in ("/v1/chat/completions", "/api/chat"):
            resp = c.post(path, content=body("a \\ud800 b"))
            assert resp.status_code == 400 and "surrogate" in resp.text, (path, resp.text)
        assert c.post("/v1/chat/completions", content=body("\\ud83c\\udf4b")).status_code == 200  # a pair: a lemon


# ----- /openapi.json tells the truth about successful answers (api/responses.py) ----------------

def _inline_refs(node, components):
    if isinstance(node, dict):
        if "$ref" in node:
            return _inline_refs(components[node["$ref"].rsplit("/", 1)[-1]], components)
        return {k: _inline_refs(v, components) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline_refs(v, components) for v in node]
    return node


def test_real_answers_match_their_documented_schemas(server):
    """One real request per operation family, with the real model loaded: each JSON answer validates
    against the schema /openapi.json documents for it (the fuzz run rarely gets past validation)."""
    import jsonschema

    with server.client() as c:
        spec = c.get("/openapi.json").json()
        components = spec["components"]["schemas"]
        chat = {"model": GEMMA_NAME, "messages": CHAT, "max_tokens": 4}
        requests = [
            ("post", "/v1/chat/completions", chat),
            ("post", "/v1/chat/completions", {**chat, "max_tokens": 40}),  # the assembled-from-stream path
            ("post", "/v1/completions", {"model": GEMMA_NAME, "prompt": "Hello", "max_tokens": 4}),
            ("post", "/v1/responses", {"model": GEMMA_NAME, "input": "Hello", "max_output_tokens": 4}),
            ("post", "/v1/messages", {"model": GEMMA_NAME, "max_tokens": 4, "messages": CHAT}),
            ("post", "/v1/messages/count_tokens", {"model": GEMMA_NAME, "messages": CHAT}),
            ("post", "/v1/tokenize", {"model": GEMMA_NAME, "content": "Hello world"}),
            ("get", "/v1/slots", None),
            ("get", "/v1/health", None), ("get", "/v1/stats", None), ("get", "/v1/system-info", None),
            ("get", "/v1/system-stats", None), ("get", "/v1/models", None), ("get", f"/v1/models/{GEMMA_NAME}", None),
            ("get", f"/v1/models/{GEMMA_NAME}/options", None), ("get", "/v1/downloads", None),
            ("post", "/api/chat", {"model": GEMMA_NAME, "messages": CHAT, "stream": False,
                                   "options": {"num_predict": 4}}),
            ("post", "/api/generate", {"model": GEMMA_NAME, "prompt": "Hello", "stream": False,
                                       "options": {"num_predict": 4}}),
            ("post", "/api/show", {"model": GEMMA_NAME}), ("get", "/api/tags", None), ("get", "/api/ps", None),
            ("get", "/api/version", None), ("get", "/internal/config", None), ("get", "/internal/aliases", None),
            ("post", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        ]
        for method, path, body in requests:
            resp = c.request(method.upper(), path, json=body)
            assert resp.status_code == 200, (path, resp.text[:300])
            template = next(p for p in spec["paths"] if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", p), path))
            schema = spec["paths"][template][method]["responses"]["200"]["content"]["application/json"]["schema"]
            jsonschema.validate(resp.json(), _inline_refs(schema, components))
