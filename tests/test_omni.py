"""The omni tool loop (openai.md "Server-side tools", mcp.md `lemonade_omni`) on real parts.

The collection is the real Gemma 3 270M (llama.cpp) as its LLM and the real Piper en_US joe voice
as its TTS model, registered with `/v1/pull` like any `collection.omni`; the image tool runs on
sd.cpp with the random-weight tiny SD 1.x model of tests/test_images.py (its pictures are noise),
and so does the edit tool (the same model labelled `edit`: sd-server's img2img).
No scripted LLM turn: the small model itself emits the tool calls. An earlier exchange in the
conversation (one call of the same tool) shows it the format for the later (`auto`) rounds, and
`tool_choice` names the tool for the first round, which the server forces with a grammar. What Gemma
writes as the text to speak is its own, so the tests check that the server's speech is real audio
(the mp3 decoded with PyAV from the Piper engine's venv), not which words it says.
"""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
from pathlib import Path

import openai
import pytest
from PIL import Image

from tests.helpers import (
    GEMMA_NAME,
    PIPER,
    TEST_CACHE,
    WEATHER_TOOLS,
    call,
    engine_lines_since,
    installed_backend,
    publish_piper,
    texts,
    weather_history,
)
from tests.sd_factory import SD_FILE, SD_REPO, publish_sd

KIT = "user.OmniKit"

def spoken_example() -> list[dict]:
    """One earlier exchange in which the assistant called text_to_speech: with it the 270M model calls
    the tool in the same format where nothing forces it."""
    call = {"id": "c0", "type": "function",
            "function": {"name": "text_to_speech", "arguments": json.dumps({"input": "Good morning"})}}
    return [{"role": "user", "content": 'Say "Good morning" out loud.'},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "content": "The speech was generated and played to the user."},
            {"role": "assistant", "content": "I said good morning."}]


SPEAK = [*spoken_example(), {"role": "user", "content": 'Say "Hello world" out loud.'}]
TOKENS = 48  # per LLM round: enough for the call (about 20 tokens; the model goes on after it) or an answer
SAY = {"type": "function", "function": {"name": "text_to_speech"}}
AUDIO_RE = re.compile(r"<audio>data:audio/mpeg;base64,([A-Za-z0-9+/=]+)</audio>")
IMAGE_RE = re.compile(r"!\[generated image\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)")
# Decodes an mp3 with PyAV (in the Piper engine's venv; the server's venv does not need it).
DECODE = r"""
import sys, av, numpy as np
with av.open(sys.argv[1]) as f:
    pcm = np.concatenate([fr.to_ndarray().reshape(-1).astype(np.float32) for fr in f.decode(audio=0)])
    rate = f.streams.audio[0].rate
if pcm.dtype != np.float32 or np.abs(pcm).max() > 1.5:
    pcm = pcm / 32768.0
print(len(pcm) / rate, float(np.sqrt(np.mean(pcm ** 2))))
"""


@pytest.fixture(scope="module")
def server(module_servers, hub_server, gemma_dir, sandbox, sdcpp_backend):
    installed_backend("piper")
    publish_piper(hub_server)
    srv = module_servers(env={**hub_server.env(), "LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir),
                              "LEMONADE_MCP_IMAGE_DIR": str(sandbox)}, engines=("llamacpp", "piper", "sd-cpp"))
    with srv.client() as http:
        resp = http.post("/v1/pull", json={"model_name": KIT, "recipe": "collection.omni",
                                           "components": [GEMMA_NAME, PIPER]})
        assert resp.status_code == 200, resp.text
    return srv


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("omni-sandbox")


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600)


def decoded_mp3(data: bytes, tmp_path: Path) -> tuple[float, float]:
    """(seconds, RMS) of an mp3, decoded by PyAV."""
    path = tmp_path / "speech.mp3"
    path.write_bytes(data)
    python = TEST_CACHE / "backends" / "piper" / "cpu" / "venv" / "bin" / "python"
    out = subprocess.run([str(python), "-c", DECODE, str(path)], check=True, capture_output=True, text=True)
    seconds, level = out.stdout.split()
    return float(seconds), float(level)


def assert_speech(content: str, tmp_path: Path) -> None:
    found = AUDIO_RE.findall(content)
    assert len(found) >= 1, content[:300]
    seconds, level = decoded_mp3(base64.b64decode(found[0]), tmp_path)
    assert seconds > 0.3 and level > 0.01, (seconds, level)


def test_collection_is_listed_with_its_components(server):
    """Downloaded components: the collection is in the default listing (under its public id)."""
    with server.client() as http:
        kit = http.get(f"/v1/models/{KIT}").json()
        assert kit["recipe"] == "collection.omni" and kit["components"] == [GEMMA_NAME, PIPER] and kit["downloaded"]
        listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        assert kit["id"] in listed  # with its components' objects, as /v1/models/{id} has them (api-openai.md)
        assert [m["id"] for m in listed[kit["id"]]["models"]] == [GEMMA_NAME, PIPER] == [m["id"] for m in kit["models"]]


def test_speech_tool_non_streamed(client, tmp_path):
    """Gemma calls text_to_speech; the server speaks with Piper and embeds the mp3 in `content`."""
    resp = client.chat.completions.create(model=KIT, messages=SPEAK, tool_choice=SAY, max_tokens=TOKENS,
                                          temperature=0)
    choice = resp.choices[0]
    assert KIT.endswith(resp.model) and resp.object == "chat.completion"
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
    assert_speech(choice.message.content, tmp_path)
    assert resp.usage.completion_tokens > 0


def test_named_tool_choice_is_forced_without_an_example(client, tmp_path):
    """No earlier call to imitate: on its own the 270M model writes prose (llama-server's `required`
    lets text come before a call, until max_tokens). A named tool is forced all the same."""
    joke = [{"role": "user", "content": "Tell me a joke about cats."}]
    resp = client.chat.completions.create(model=KIT, messages=joke, tool_choice=SAY, max_tokens=TOKENS, temperature=0)
    assert_speech(resp.choices[0].message.content, tmp_path)


def test_speech_tool_streamed(client, tmp_path):
    """Streamed: the audio arrives as content deltas (none longer than 16000 characters), the stream
    ends with a finish reason; the official client reads it."""
    stream = client.chat.completions.create(model=KIT, messages=SPEAK, tool_choice=SAY, max_tokens=TOKENS,
                                            temperature=0, stream=True)
    chunks = list(stream)
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert all(len(d) <= 16000 for d in deltas)
    content = "".join(deltas)
    assert content.startswith("<audio>data:audio/mpeg;base64,")  # the medium is the first content sent
    assert_speech(content, tmp_path)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] in (
        ["stop"], ["length"])


def test_client_tool_comes_back_as_tool_calls(client):
    """A client tool is merged with ours; the LLM's call to it is the client's to run
    (`finish_reason: "tool_calls"`)."""
    messages = weather_history()
    resp = client.chat.completions.create(model=KIT, messages=messages, tools=WEATHER_TOOLS, max_tokens=TOKENS,
                                          temperature=0, tool_choice="required")
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls and calls[0].function.name == "get_weather" and "city" in json.loads(calls[0].function.arguments)
    assert "<audio>" not in (choice.message.content or "")
    # Resuming, the client sends the call back with its result: the LLM gets both, still paired by id
    # (what the 270M model says next is its own: often another call, which max_tokens may cut short).
    from lemonade.omni.loop import prepared_message

    echoed = choice.message.model_dump(exclude_none=True)
    result = {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny"}
    assert prepared_message(echoed, False)["tool_calls"][0]["id"] == calls[0].id
    assert prepared_message(result, False) == result


def test_client_tool_call_streamed(client):
    stream = client.chat.completions.create(
        model=KIT, messages=weather_history(), tools=WEATHER_TOOLS, max_tokens=TOKENS, temperature=0, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    chunks = list(stream)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert calls and calls[0].function.name == "get_weather" and calls[0].index == 0 and calls[0].id
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_echoed_media_is_not_sent_to_the_llm(client, server):
    """A client sends our earlier answer back (with its base64 audio): the LLM sees a placeholder, so
    a megabyte of base64 does not overflow its context."""
    blob = base64.b64encode(b"\xff\xfb" * 300_000).decode()
    history = [{"role": "user", "content": "Say hi out loud."},
               {"role": "assistant", "content": f"Here it is.\n\n<audio>data:audio/mpeg;base64,{blob}</audio>"},
               {"role": "user", "content": "Thanks! Now just say ok in text."}]
    resp = client.chat.completions.create(model=KIT, messages=history, max_tokens=8, temperature=0)
    assert resp.choices[0].finish_reason in ("stop", "length")
    assert resp.usage.prompt_tokens < 2000


def test_echoed_media_placeholders():
    """Pure functions: each media form our answers carry becomes a short placeholder, other text stays;
    the conversation's last image (what edit_image starts from) is found in text or image parts."""
    from lemonade.omni.loop import last_image, strip_media

    png, mp3 = base64.b64encode(b"\x89PNG" * 50).decode(), base64.b64encode(b"ID3" * 50).decode()
    text = (f"Here.\n\n![generated image](data:image/png;base64,{png})\n\n<audio>data:audio/mpeg;base64,{mp3}</audio>"
            f" and data:image/jpeg;base64,{png} end")
    assert strip_media(text) == "Here.\n\n[generated image]\n\n[generated audio] and [image] end"
    assert strip_media("no media: data:text/plain,hello") == "no media: data:text/plain,hello"
    upload = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"up").decode()}}
    assert last_image([{"role": "assistant", "content": text}]) == b"\x89PNG" * 50
    assert last_image([{"role": "assistant", "content": text}, {"role": "user", "content": [upload]}]) == b"up"
    assert last_image([{"role": "user", "content": "no image"}]) is None


@pytest.mark.parametrize(("body", "status", "needle"), [
    ({"tool_choice": {"type": "function", "function": {"name": "paint"}}}, 400, "tool_choice"),
    ({"tools": [{"type": "function", "function": {}}]}, 400, "tools"),
    ({"messages": []}, 400, "messages"),
])
def test_bad_input(server, body, status, needle):
    with server.client() as http:
        resp = http.post("/v1/chat/completions", json={"model": KIT, "messages": SPEAK, **body})
    assert resp.status_code == status and needle in resp.text, resp.text


def test_collection_without_llm_is_refused(server):
    with server.client() as http:
        assert http.post("/v1/pull", json={"model_name": "user.Voiceless", "recipe": "collection.omni",
                                           "components": [PIPER]}).status_code == 200
        resp = http.post("/v1/chat/completions", json={"model": "user.Voiceless", "messages": SPEAK})
        assert resp.status_code == 400 and "without a chat model" in resp.json()["error"]["message"]
        streamed = http.post("/v1/chat/completions", json={"model": "user.Voiceless", "messages": SPEAK,
                                                           "stream": True})
        assert streamed.status_code == 400


def test_collection_system_prompt_is_a_template(server):
    """A collection's own `system_prompt` must keep both placeholders (custom-models.md)."""
    body = {"model_name": "user.Prompted", "recipe": "collection.omni", "components": [GEMMA_NAME, PIPER]}
    with server.client() as http:
        bad = http.post("/v1/pull", json={**body, "system_prompt": "You draw things."})
        assert bad.status_code == 400 and "system_prompt" in bad.text and "{tool_list}" in bad.text
        good = "Be brief. Tools:\n{tool_list}{tool_guidance}"
        assert http.post("/v1/pull", json={**body, "system_prompt": good}).status_code == 200
        assert http.get("/v1/models/user.Prompted").json()["system_prompt"] == good


def test_mcp_omni_writes_audio_into_the_sandbox(server, sandbox, tmp_path):
    """No `model`: the downloaded collection is used (the default LMX-Omni-5.5B-Lite is not downloaded)."""
    result = call(server, "lemonade_omni", {"messages": SPEAK, "output_dir": "omni",
                                            "tool_choice": SAY, "max_tokens": TOKENS, "temperature": 0})
    assert result.is_error is False, texts(result)
    blocks = texts(result)
    paths = json.loads(blocks[-1])["paths"]
    assert len(paths) >= 1 and blocks[1] == f"audio -> {paths[0]}"
    written = Path(paths[0])
    assert written.parent == (sandbox / "omni").resolve() and re.fullmatch(r"omni_.+_0\.mp3", written.name)
    seconds, level = decoded_mp3(written.read_bytes(), tmp_path)
    assert seconds > 0.3 and level > 0.01


def test_mcp_omni_refusals(server):
    plain = call(server, "lemonade_omni", {"model": GEMMA_NAME, "messages": SPEAK})
    assert plain.is_error is True and "lemonade_chat" in texts(plain)[0]
    escape = call(server, "lemonade_omni", {"model": KIT, "messages": SPEAK, "output_dir": "../out"})
    assert escape.is_error is True and "sandbox" in texts(escape)[0]
    named = call(server, "lemonade_omni", {"model": KIT, "messages": SPEAK,
                                           "tool_choice": {"type": "function", "function": {"name": "paint"}}})
    assert named.is_error is True and "tool_choice" in texts(named)[0]


def drawn_example() -> list[dict]:
    call = {"id": "d0", "type": "function",
            "function": {"name": "generate_image", "arguments": json.dumps({"prompt": "a green tree"})}}
    return [{"role": "user", "content": 'Draw "a green tree".'},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "d0", "content": "The image was generated and shown to the user."},
            {"role": "assistant", "content": "Here is a green tree."}]


@pytest.fixture(scope="module")
def draw_kit(server, hub_server) -> str:
    """A collection of Gemma and the random-weight tiny SD 1.x model of tests/test_images.py (its
    pictures are noise; 64x64 and 1 step by its `image_defaults`, so it is fast)."""
    publish_sd(hub_server)
    with server.client() as http:
        resp = http.post("/v1/pull", json={"model_name": "user.Omni-SD", "checkpoint": f"{SD_REPO}:{SD_FILE}",
                                           "recipe": "sd-cpp", "labels": ["image"],
                                           "image_defaults": {"steps": 1, "cfg_scale": 1.0, "width": 64, "height": 64}})
        assert resp.status_code == 200, resp.text
        resp = http.post("/v1/pull", json={"model_name": "user.DrawKit", "recipe": "collection.omni",
                                           "components": [GEMMA_NAME, "user.Omni-SD"]})
        assert resp.status_code == 200, resp.text
    return "user.DrawKit"


def test_image_tool(client, draw_kit):
    """Gemma calls generate_image; sd.cpp makes the PNG, embedded as a markdown image."""
    messages = [*drawn_example(), {"role": "user", "content": 'Draw "a red apple".'}]
    resp = client.chat.completions.create(model=draw_kit, messages=messages, max_tokens=TOKENS, temperature=0,
                                          tool_choice={"type": "function", "function": {"name": "generate_image"}})
    found = IMAGE_RE.findall(resp.choices[0].message.content)
    assert len(found) == 1, resp.choices[0].message.content[:300]
    image = Image.open(io.BytesIO(base64.b64decode(found[0])))
    assert image.format == "PNG" and image.size == (64, 64)



@pytest.fixture(scope="module")
def edit_kit(server, hub_server) -> str:
    """Gemma and the same random-weight SD model, labelled `edit` too, so the loop offers edit_image."""
    publish_sd(hub_server)
    with server.client() as http:
        resp = http.post("/v1/pull", json={"model_name": "user.Omni-SD-Edit", "checkpoint": f"{SD_REPO}:{SD_FILE}",
                                           "recipe": "sd-cpp", "labels": ["image", "edit"],
                                           "image_defaults": {"steps": 1, "cfg_scale": 1.0, "width": 64, "height": 64}})
        assert resp.status_code == 200, resp.text
        resp = http.post("/v1/pull", json={"model_name": "user.EditKit", "recipe": "collection.omni",
                                           "components": [GEMMA_NAME, "user.Omni-SD-Edit"]})
        assert resp.status_code == 200, resp.text
    return "user.EditKit"


def edited_example(upload: dict) -> list[dict]:
    """An earlier exchange: the user uploaded a picture (`upload`, an image_url part, which Gemma
    sees as "[image]") and asked for an edit; the assistant called edit_image. Forced to call
    edit_image, the 270M model writes every optional argument of it, whatever an example leaves out
    ("size": "100", "steps": 100, a 16-digit seed, until max_tokens cut the call); an example call
    with all of them set to this model's defaults it copies, so the edit is valid and small."""
    args = {"prompt": "a green tree", "size": "64x64", "steps": 1, "cfg_scale": 1.0, "seed": 7}
    call = {"id": "e0", "type": "function", "function": {"name": "edit_image", "arguments": json.dumps(args)}}
    return [{"role": "user", "content": [upload, {"type": "text", "text": 'Edit "a green tree".'}]},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "e0", "content": "The image was edited and shown to the user."},
            {"role": "assistant", "content": "Here is a green tree."}]


def test_edit_image_tool_edits_the_conversations_image(client, server, edit_kit):
    """Gemma calls edit_image (named in tool_choice, forced by the grammar) on the picture the user
    uploaded earlier in the conversation (the only image in it, so what the edit starts from);
    sd.cpp runs it as an edit (its own log says EDIT mode and encodes the init image), and the new
    PNG comes back in the answer."""
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(buf, format="PNG")
    source = buf.getvalue()
    upload = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(source).decode()}}
    messages = [*edited_example(upload), {"role": "user", "content": 'Edit "a red apple".'}]
    seq, _ = engine_lines_since(server, 0, "")
    # edit_image's call with its five arguments is about 45 tokens: TOKENS left it cut inside "seed" once
    resp = client.chat.completions.create(model=edit_kit, messages=messages, max_tokens=2 * TOKENS, temperature=0,
                                          tool_choice={"type": "function", "function": {"name": "edit_image"}})
    found = IMAGE_RE.findall(resp.choices[0].message.content)
    assert len(found) == 1, resp.choices[0].message.content[:300]
    edited = base64.b64decode(found[0])
    assert edited != source
    image = Image.open(io.BytesIO(edited))
    assert image.format == "PNG" and image.size == (64, 64)
    _, lines = engine_lines_since(server, seq, "engine.sd-server:Omni-SD-Edit")
    assert any("EDIT mode" in line for line in lines), lines[-20:]
    assert any("encode_first_stage completed" in line for line in lines), lines[-20:]  # the picture it started from
