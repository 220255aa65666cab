"""Issue 5, part 1: the Ollama API, driven by the official `ollama` Python client (and httpx for bad
inputs) against the real server, the real llama-server and real models: Gemma 3 270M (a base model,
so answers are checked for shape, not meaning) and all-MiniLM-L6-v2 for embeddings. Pulls go to
the local Hugging Face hub test server.
"""

from __future__ import annotations

import base64
import math
import os
import signal
import struct
import time
import zlib
from pathlib import Path

import httpx
import ollama
import pytest

from tests.helpers import GEMMA_NAME, Server, ServerFactory
from tests.models import minilm_gguf

EMBED = "all-minilm-l6-v2-f16"
PULL_NAME = "user.ollama-pull-test"
PULL_CHECKPOINT = "test-org/tiny-multiquant-GGUF:Q4_K_M"  # a tiny file: only the download path matters
SHORT = {"num_predict": 8, "temperature": 0, "seed": 7}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}



def listed_names(client: ollama.Client) -> set[str]:
    return {m.model.removesuffix(":latest") for m in client.list().models}


def running_names(client: ollama.Client) -> set[str]:
    return {m.model.removesuffix(":latest") for m in client.ps().models}

def weather_history() -> list[dict]:
    """Three worked tool-call rounds, then a new question: the base model continues the pattern."""
    history: list[dict] = []
    for city in ("Paris", "Rome", "Oslo"):
        history += [{"role": "user", "content": f"Weather in {city}?"},
                    {"role": "assistant", "content": "",
                     "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": city}}}]},
                    {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
                    {"role": "assistant", "content": f"It is sunny in {city}."}]
    return history + [{"role": "user", "content": "Weather in Berlin?"}]


def tiny_png() -> str:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b""))
    return base64.b64encode(png).decode()


@pytest.fixture(scope="module")
def server(module_servers: ServerFactory, gemma_dir: Path, hub_server,
           tmp_path_factory: pytest.TempPathFactory) -> Server:
    extra = tmp_path_factory.mktemp("ollama-models")
    gemma = next(gemma_dir.glob("*.gguf"))
    (extra / gemma.name).symlink_to(gemma)
    minilm = minilm_gguf()
    (extra / minilm.name).symlink_to(minilm)
    return module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(extra), **hub_server.env()})


@pytest.fixture(scope="module")
def client(server: Server) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=300)


def check_durations(resp) -> None:
    for field in ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
                  "eval_duration"):
        value = getattr(resp, field)
        assert isinstance(value, int) and value >= 0, (field, value)
    assert resp.prompt_eval_count > 0 and resp.eval_count > 0
    assert resp.total_duration > 0 and resp.eval_duration > 0


# ----- models --------------------------------------------------------------------------------------

def test_version(client: ollama.Client, server: Server) -> None:
    with server.client() as c:
        body = c.get("/api/version").json()
    assert isinstance(body["version"], str) and body["version"].count(".") == 2


def test_list_shows_downloaded_models_with_gguf_details(client: ollama.Client) -> None:
    listed = client.list().models
    assert all(m.model.endswith(":latest") for m in listed)  # as Ollama lists them
    models = {m.model.removesuffix(":latest"): m for m in listed}
    assert GEMMA_NAME in models and EMBED in models
    gemma = models[GEMMA_NAME]
    assert gemma.size > 100_000_000 and gemma.modified_at is not None and len(gemma.digest) == 64
    assert gemma.details.format == "gguf" and gemma.details.family == "gemma3"
    assert gemma.details.quantization_level == "Q4_K_M" and gemma.details.parameter_size == "270M"
    # nothing that is not downloaded is listed
    assert "Qwen3-0.6B-GGUF" not in models


def test_show(client: ollama.Client) -> None:
    info = client.show(GEMMA_NAME)
    assert "completion" in info.capabilities
    assert info.details.family == "gemma3"
    assert info.modelinfo["general.architecture"] == "gemma3"
    assert info.modelinfo["gemma3.context_length"] > 0
    assert info.template and info.modelfile.startswith("# Modelfile")
    assert client.show(GEMMA_NAME + ":latest").details.family == "gemma3"  # Ollama's default tag is accepted
    assert client.show(EMBED).capabilities == ["embedding"]


# ----- chat and generate ---------------------------------------------------------------------------

def test_chat_maps_options_and_reports_timings(client: ollama.Client) -> None:
    # The first request of the module loads Gemma: num_ctx becomes its context size.
    resp = client.chat(model=GEMMA_NAME, messages=[{"role": "system", "content": "You are brief."},
                                                   {"role": "user", "content": "Hello"}],
                       options={**SHORT, "num_ctx": 2048, "top_k": 20, "top_p": 0.9, "repeat_penalty": 1.1,
                                "stop": ["<end_of_turn>"]})
    assert resp.done is True and resp.done_reason in ("stop", "length")
    assert resp.message.role == "assistant" and resp.message.content
    assert resp.model == GEMMA_NAME and resp.created_at
    check_durations(resp)
    assert resp.load_duration > 0  # this request loaded the model
    assert resp.eval_count <= 8
    running = {m.model.removesuffix(":latest"): m for m in client.ps().models}
    assert running[GEMMA_NAME].context_length == 2048
    assert running[GEMMA_NAME].details.family == "gemma3" and running[GEMMA_NAME].expires_at is not None
    assert running[GEMMA_NAME].size > 0 and running[GEMMA_NAME].size_vram == 0  # the cpu backend: no GPU memory


def test_chat_stream(client: ollama.Client) -> None:
    parts = list(client.chat(model=GEMMA_NAME, messages=[{"role": "user", "content": "Tell me a story"}],
                             stream=True, options=SHORT))
    assert len(parts) >= 2
    assert all(p.done is False for p in parts[:-1]) and parts[-1].done is True
    assert parts[-1].done_reason in ("stop", "length")
    assert "".join(p.message.content for p in parts[:-1])
    check_durations(parts[-1])
    assert parts[-1].load_duration == 0  # already loaded


def test_chat_tool_calls(client: ollama.Client) -> None:
    resp = client.chat(model=GEMMA_NAME, messages=weather_history(), tools=[WEATHER_TOOL],
                       options={"num_predict": 40, "temperature": 0})
    calls = resp.message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    assert isinstance(calls[0].function.arguments, dict) and "city" in calls[0].function.arguments


def test_chat_tool_calls_stream(client: ollama.Client) -> None:
    parts = list(client.chat(model=GEMMA_NAME, messages=weather_history(), tools=[WEATHER_TOOL], stream=True,
                             options={"num_predict": 40, "temperature": 0}))
    with_calls = [p for p in parts if p.message.tool_calls]
    assert len(with_calls) == 1  # one message carrying the complete call(s), never fragments
    calls = with_calls[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert isinstance(calls[0].function.arguments, dict) and "city" in calls[0].function.arguments
    assert parts[-1].done is True


def test_chat_format_constrains_output_to_json(client: ollama.Client) -> None:
    # The schema becomes a grammar: even a base model can only write that object (maybe cut by num_predict).
    resp = client.chat(model=GEMMA_NAME, messages=[{"role": "user", "content": "Give me a JSON object"}],
                       format={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                       options={"num_predict": 12, "temperature": 0})
    assert resp.message.content.lstrip().startswith('{"a"') or resp.message.content.lstrip().startswith("{")


def test_generate(client: ollama.Client) -> None:
    resp = client.generate(model=GEMMA_NAME, prompt="Why is the sky blue?", system="Answer briefly.", options=SHORT)
    assert resp.done is True and resp.response and resp.done_reason in ("stop", "length")
    check_durations(resp)


def test_generate_raw_stream(client: ollama.Client) -> None:
    parts = list(client.generate(model=GEMMA_NAME, prompt="The capital of France is", raw=True, stream=True,
                                 options=SHORT))
    assert parts[-1].done is True and all(p.done is False for p in parts[:-1])
    assert "".join(p.response for p in parts)
    check_durations(parts[-1])


def test_images_reach_the_model_or_are_refused_with_400(client: ollama.Client) -> None:
    # Gemma 270M has no vision projector: a valid image is refused before it reaches the engine.
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model=GEMMA_NAME, messages=[{"role": "user", "content": "What is this?", "images": [tiny_png()]}])
    assert err.value.status_code == 400 and "does not accept images" in err.value.error


def test_empty_chat_loads_and_keep_alive_zero_unloads(client: ollama.Client) -> None:
    resp = client.chat(model=GEMMA_NAME, messages=[])
    assert resp.done is True and resp.done_reason == "load"
    assert GEMMA_NAME in running_names(client)
    resp = client.generate(model=GEMMA_NAME, prompt="", keep_alive=0)
    assert resp.done_reason == "unload"
    assert GEMMA_NAME not in running_names(client)


def test_engine_dying_mid_stream_ends_with_an_error_line(client: ollama.Client, server: Server) -> None:
    stream = client.chat(model=GEMMA_NAME, messages=[{"role": "user", "content": "Write a long story"}],
                         stream=True, options={"num_predict": 4000})
    first = next(stream)
    assert first.done is False
    for pid in server.engine_pids():
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(ollama.ResponseError) as err:
        for _part in stream:
            pass
    assert "engine" in err.value.error
    # once the server has noticed the crash, the next request starts the engine again
    deadline = time.monotonic() + 30
    while GEMMA_NAME in running_names(client) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.chat(model=GEMMA_NAME, messages=[{"role": "user", "content": "Hi"}], options=SHORT).done


# ----- embeddings ----------------------------------------------------------------------------------

def test_embed(client: ollama.Client, server: Server) -> None:
    resp = client.embed(model=EMBED, input=["the cat sat on the mat", "a dog ran in the park"])
    assert len(resp.embeddings) == 2 and len(resp.embeddings[0]) == 384
    assert resp.prompt_eval_count > 0 and resp.total_duration > 0
    assert math.isclose(sum(v * v for v in resp.embeddings[0]), 1.0, rel_tol=1e-3)
    single = client.embed(model=EMBED, input="hello")
    assert len(single.embeddings) == 1
    legacy = client.embeddings(model=EMBED, prompt="hello")
    assert len(legacy.embedding) == 384
    with server.client() as c:
        cut = c.post("/api/embed", json={"model": EMBED, "input": "hello", "dimensions": 8}).json()
    assert len(cut["embeddings"][0]) == 8
    assert math.isclose(sum(v * v for v in cut["embeddings"][0]), 1.0, rel_tol=1e-6)


# ----- pull and delete -----------------------------------------------------------------------------

def test_pull_and_delete(client: ollama.Client, server: Server) -> None:
    with server.client() as c:
        reg = c.post("/v1/models/register", json={"model_name": PULL_NAME, "checkpoint": PULL_CHECKPOINT,
                                                  "recipe": "llamacpp"})
        assert reg.status_code == 200, reg.text
    listed_as = PULL_NAME.removeprefix("user.")  # /api/tags shows the public id (it shadows nothing)
    assert listed_as not in listed_names(client)
    progress = list(client.pull(PULL_NAME, stream=True))
    assert progress[0].status == "pulling manifest" and progress[-1].status == "success"
    downloading = [p for p in progress if p.digest]
    assert downloading and all(p.digest.startswith("sha256:") for p in downloading)
    assert downloading[-1].completed == downloading[-1].total > 0
    assert listed_as in listed_names(client)
    assert client.pull(PULL_NAME).status == "success"  # already there: non-streamed pull succeeds at once
    assert client.delete(PULL_NAME).status == "success"
    assert listed_as not in listed_names(client)
    with pytest.raises(ollama.ResponseError) as err:
        client.delete(PULL_NAME)
    assert err.value.status_code == 404


# ----- not supported and bad input -----------------------------------------------------------------

def test_create_copy_push_are_501(client: ollama.Client, server: Server) -> None:
    with pytest.raises(ollama.ResponseError) as err:
        client.copy(GEMMA_NAME, "copy-of-gemma")
    assert err.value.status_code == 501
    with server.client() as c:
        for path in ("/api/create", "/api/push"):
            resp = c.post(path, json={"model": "x"})
            assert resp.status_code == 501 and "not supported" in resp.json()["error"]


@pytest.mark.parametrize(("method", "path", "body", "status", "mentions"), [
    ("POST", "/api/chat", {"messages": []}, 400, "'model'"),
    ("POST", "/api/chat", {"model": "no-such-model", "messages": []}, 404, "not found"),
    ("POST", "/api/chat", {"model": GEMMA_NAME, "options": {"temperature": "hot"}}, 400, "options.temperature"),
    ("POST", "/api/chat", {"model": GEMMA_NAME, "options": {"num_ctx": 0}}, 400, "options.num_ctx"),
    ("POST", "/api/chat", {"model": GEMMA_NAME, "messages": [{"role": "robot", "content": "x"}]}, 400,
     "messages.0.role"),
    ("POST", "/api/chat", {"model": GEMMA_NAME, "messages": [{"role": "user", "content": "x", "images": ["@@"]}]},
     400, "messages.0.images[0]"),
    ("POST", "/api/chat", {"model": EMBED, "messages": [{"role": "user", "content": "x"}]}, 400, "/api/embed"),
    ("POST", "/api/chat", [1, 2], 400, "JSON object"),
    ("POST", "/api/generate", {"model": GEMMA_NAME, "prompt": "x", "suffix": "y"}, 400, "suffix"),
    ("POST", "/api/generate", {"model": GEMMA_NAME, "prompt": 5}, 400, "prompt"),
    # image generation is checked before any load (tests/test_images.py generates)
    ("POST", "/api/generate", {"model": "SD-Turbo", "prompt": "a lemon", "width": 100, "height": 64}, 400, "size"),
    ("POST", "/api/generate", {"model": "RealESRGAN-x4plus", "prompt": "a lemon"}, 400, "/images/upscale"),
    ("POST", "/api/embed", {"model": GEMMA_NAME, "input": "x"}, 400, "chat"),
    ("POST", "/api/embed", {"model": EMBED}, 400, "input"),
    ("POST", "/api/embeddings", {"model": EMBED, "prompt": ["a"]}, 400, "prompt"),
    ("POST", "/api/show", {}, 400, "model"),
    ("POST", "/api/show", {"model": "no-such-model"}, 404, "not found"),
    ("DELETE", "/api/delete", {"model": "no-such-model"}, 404, "not found"),
    ("DELETE", "/api/delete", {"model": GEMMA_NAME}, 400, "extra models directory"),
    ("POST", "/api/pull", {"model": "no-such-model"}, 404, "not found"),
])
def test_bad_input_answers_4xx_in_ollama_shape(server: Server, method: str, path: str, body, status: int,
                                               mentions: str) -> None:
    with server.client() as c:
        resp = c.request(method, path, json=body)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert isinstance(error, str) and mentions in error, error


def test_body_without_json_content_type_is_read(server: Server) -> None:
    """`curl -d '{...}'` (form content type) is how Ollama's own docs call the API."""
    with server.client() as c:
        resp = c.post("/api/show", content=b'{"model": "%s"}' % GEMMA_NAME.encode(),
                      headers={"Content-Type": "application/x-www-form-urlencoded"})
        bad = c.post("/api/show", content=b"{not json")
    assert resp.status_code == 200 and resp.json()["details"]["family"] == "gemma3"
    assert bad.status_code == 400 and "Invalid JSON body" in bad.json()["error"]


def test_ollama_paths_need_the_api_key(make_server, gemma_dir: Path) -> None:
    srv = make_server(env={"LEMONADE_API_KEY": "s3cret", "LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    resp = httpx.get(srv.url + "/api/tags")
    assert resp.status_code == 401 and isinstance(resp.json()["error"], str)
    authed = ollama.Client(host=srv.url, headers={"Authorization": "Bearer s3cret"})
    assert GEMMA_NAME in listed_names(authed)


def test_root_answers_ollama_probes(server: Server) -> None:
    """Ollama clients check that `GET /` (and `HEAD /`) answer 200 before anything else. The page is
    the web app's HTML for any Accept but text/plain alone, which gets Ollama's own probe text."""
    with httpx.Client(base_url=server.url) as c:
        probe = c.get("/")
        assert probe.status_code == 200 and probe.headers["content-type"].startswith("text/html")
        assert c.head("/").status_code == 200
        plain = c.get("/", headers={"Accept": "text/plain"})
        assert plain.status_code == 200 and plain.text == "Ollama is running"
        browser = c.get("/", headers={"Accept": "text/html,application/xhtml+xml"})
        assert browser.status_code == 200 and browser.headers["content-type"].startswith("text/html")
        assert '<script type="module" src="renderer.bundle.js">' in browser.text
    assert ollama.Client(host=server.url).list().models  # the official client connects
