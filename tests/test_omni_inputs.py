"""Omni collections reading what the user sends (issue 43, item 6): `transcribe_audio` on the
collection's transcription model and `analyze_image` on its vision model, run by the server's tool
loop as upstream Lemonade's desktop app runs them.

Real parts: the LLM is Gemma 3 270M (llama.cpp); the transcription model is faster-whisper's
Whisper tiny.en (`Whisper-Tiny-En-CT2`, real weights, fetched from the local hub), hearing speech
espeak-ng made (tests/speech.py: that sentence comes back word for word); the vision model is Gemma
with the random-weight projector of tests/vision_projector.py, so what it says about a picture means
nothing, and what the test checks is that the picture reached its engine and was encoded there.
As in test_omni.py, the 270M model is driven, not trusted: `tool_choice` names the tool for the first
round (forced by a grammar), and an earlier exchange of the conversation shows it how an answer
uses the tool's result.
"""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import openai
import pytest
from PIL import Image

from tests.helpers import GEMMA_NAME, WHISPER, engine_lines_since, publish_whisper
from tests.speech import SENTENCE, speak, words

EAR_KIT, EYE_KIT, SEEING_KIT = "user.EarKit", "user.EyeKit", "user.SeeingKit"
VISION = "gemma-vision"  # Gemma + the random-weight projector: a chat model with the `vision` label
HEAR = {"type": "function", "function": {"name": "transcribe_audio"}}
LOOK = {"type": "function", "function": {"name": "analyze_image"}}


@pytest.fixture(scope="module")
def server(module_servers, hub_server, gemma_dir, whisper_backend, whisper_ct2_dir, tmp_path_factory):
    from tests.vision_projector import write_vision_projector

    gemma = next(gemma_dir.glob("*.gguf"))
    extra = tmp_path_factory.mktemp("omni-input-models")
    (extra / gemma.name).symlink_to(gemma)
    (extra / VISION).mkdir()
    (extra / VISION / gemma.name).symlink_to(gemma)
    write_vision_projector(extra / VISION / "mmproj-random-f32.gguf")
    publish_whisper(hub_server, whisper_ct2_dir)
    # Warm swaps off (kv_store_gb 0): with them Gemma 3 gets its full window cache, so each tool round
    # reuses the last one's prompt, and the 270M base model's few-shot echo of a transcript is a near tie
    # such a reused prefix tips. The thread count and the batch split tip it too (float sums in another
    # order): with one thread and llama-server's own batch of 2,048 tokens the model answers with the
    # transcript, with two threads (the server's choice on a quiet machine) or the shipped batch of one
    # ubatch (backends/llamacpp/engine.py batch_args) it repeats the last answer (measured, 2026-12-06).
    # Both are fixed here so that the test does not depend on the machine's load. This file proves the
    # omni roles (which audio and picture reach which tool), not warm swaps (tests/test_warm_swaps.py),
    # threads (tests/test_backend_args.py) or the batch size (tests/test_context.py).
    srv = module_servers(env={**hub_server.env(), "LEMONADE_EXTRA_MODELS_DIR": str(extra)},
                         config={"kv_store_gb": 0, "llamacpp": {"args": "-t 1 -b 2048"}})
    with srv.client() as http:
        for name, components in ((EAR_KIT, [GEMMA_NAME, WHISPER]), (EYE_KIT, [GEMMA_NAME, VISION]),
                                 (SEEING_KIT, [VISION, WHISPER])):
            resp = http.post("/v1/pull", json={"model_name": name, "recipe": "collection.omni",
                                               "components": components}, timeout=600)
            assert resp.status_code == 200, resp.text
    return srv


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600)


def voice(text: str, folder: Path) -> dict:
    """`text` spoken by espeak-ng, as a chat `input_audio` part."""
    folder.mkdir(parents=True, exist_ok=True)
    wav = speak(text, folder / "voice.wav")
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav.read_bytes()).decode(),
                                                   "format": "wav"}}


def picture(color: tuple[int, int, int]) -> dict:
    buf = io.BytesIO()
    Image.new("RGB", (56, 56), color).save(buf, format="PNG")
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(buf.getvalue())
                                               .decode()}}


def heard_before(said: str, n: int, tmp_path: Path) -> list[dict]:
    """An earlier exchange: the user sent speech and asked what they said, the assistant called
    transcribe_audio and answered with the transcript. With two of them (one leaves it calling the
    tool again), the 270M model answers a third the same way."""
    call = {"id": f"t{n}", "type": "function",
            "function": {"name": "transcribe_audio", "arguments": json.dumps({"language": "en"})}}
    return [{"role": "user", "content": [{"type": "text", "text": "What did I say?"},
                                         voice(said, tmp_path / str(n))]},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"t{n}", "content": f"Transcription: {said}"},
            {"role": "assistant", "content": f"You said: {said}"}]


def test_transcribe_audio_hears_the_users_voice_message(client, server, tmp_path):
    """The user sends speech (`input_audio`); the LLM sees "[User provided audio file #3]" and calls
    transcribe_audio; Whisper transcribes the latest audio (not an earlier one), and the LLM answers
    with the transcript: the sentence's words are in the answer, which only the audio held."""
    earlier = heard_before("Good morning everyone.", 1, tmp_path) + heard_before("I am hungry.", 2, tmp_path)
    asked = {"role": "user", "content": [{"type": "text", "text": "What did I say?"},
                                         voice(SENTENCE, tmp_path / "3")]}
    resp = client.chat.completions.create(model=EAR_KIT, messages=[*earlier, asked], tool_choice=HEAR,
                                          max_tokens=48, temperature=0)
    answer = resp.choices[0].message.content or ""
    said = words(SENTENCE)
    heard = [w for w in said if w in words(answer)]
    assert len(heard) >= 0.6 * len(said), answer
    assert "morning" not in answer.lower() and "hungry" not in answer.lower(), answer  # not an earlier clip
    with server.client() as http:
        metrics = http.get("/metrics").text
    assert any(line.startswith("lemonade_") and WHISPER in line and "audio/transcriptions" in line
               for line in metrics.splitlines()), "no transcription counted for " + WHISPER


def test_analyze_image_shows_the_picture_to_the_vision_component(client, server):
    """The LLM cannot see (Gemma 270M without a projector): the user's picture becomes "[User provided
    image #1]" for it, and its analyze_image call sends the picture with its question to the
    collection's vision model. How the picture is shown to arrive: the projector turns it into
    IMAGE_TOKENS embeddings, so the prompt the vision model's llama-server evaluated (its own log) is
    at least that much longer than the same question without a picture."""
    from tests.vision_projector import IMAGE_TOKENS

    seq, _ = engine_lines_since(server, 0, "")
    # An earlier exchange, its picture already a placeholder (as a client that keeps no old pictures
    # sends it): without one to copy, the 270M model writes a question that never ends. "describe" is
    # upstream's word for a general description.
    call = {"id": "a0", "type": "function", "function": {
        "name": "analyze_image", "arguments": json.dumps({"image_url": "#1", "question": "describe"})}}
    earlier = [{"role": "user", "content": "[User provided image #1]\nWhat is in it?"},
               {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "a0", "content": "Image analysis: A red square."},
               {"role": "assistant", "content": "It is a red square."}]
    asked = {"role": "user", "content": [picture((250, 220, 40)), {"type": "text", "text": "What is in it?"}]}
    resp = client.chat.completions.create(model=EYE_KIT, messages=[*earlier, asked], tool_choice=LOOK,
                                          max_tokens=48, temperature=0)
    assert resp.choices[0].finish_reason in ("stop", "length")
    _, lines = engine_lines_since(server, seq, f"engine.llama-server:{VISION}")
    evaluated = [int(m.group(1)) for line in lines
                 for m in [re.search(r"prompt eval time = .* / +(\d+) tokens", line)] if m]
    assert evaluated, "the vision model was not asked: " + "\n".join(lines[-10:])
    text_only = client.chat.completions.create(model=VISION, max_tokens=1, temperature=0, messages=[
        {"role": "user", "content": [{"type": "text", "text": "Describe this image."}]}])
    assert evaluated[0] >= text_only.usage.prompt_tokens + IMAGE_TOKENS, (evaluated, text_only.usage)


def test_an_llm_that_sees_gets_the_picture_itself(server):
    """A collection whose LLM has vision offers no analyze_image (the picture goes to the LLM in its
    own message); naming that tool is a 400, and so is audio that is not base64, naming the part,
    before a stream starts."""
    # greedy: what the 270M model writes in its 4 tokens decides the rounds that follow (a forced call
    # cut to blank arguments once made llama-server refuse the replayed conversation: tests/unit/test_omni_replay.py)
    body = {"messages": [{"role": "user", "content": [picture((0, 0, 255)), {"type": "text", "text": "Hi"}]}],
            "max_tokens": 4, "temperature": 0}
    with server.client() as http:
        refused = http.post("/v1/chat/completions", json={**body, "model": SEEING_KIT, "tool_choice": LOOK})
        assert refused.status_code == 400 and "tool_choice" in refused.text, refused.text
        allowed = http.post("/v1/chat/completions", json={**body, "model": SEEING_KIT, "tool_choice": HEAR})
        assert allowed.status_code == 200, allowed.text  # the collection does have transcribe_audio
        bad = {"role": "user", "content": [{"type": "text", "text": "Listen"},
                                           {"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}}]}
        for stream in (False, True):
            resp = http.post("/v1/chat/completions", json={"model": EAR_KIT, "messages": [bad], "stream": stream})
            assert resp.status_code == 400, resp.text
            assert "messages[0].content[1].input_audio.data" in resp.json()["error"]["message"]


def test_what_the_user_sent_is_numbered_for_the_tools():
    """Pure: user audio and pictures become numbered placeholders and the turn's clips and images;
    an LLM that sees gets pictures as they are; media in other roles are plain placeholders; which
    picture analyze_image takes for each form of `image_url`."""
    from lemonade.omni.loop import prepared_message
    from lemonade.omni.media import Artifact, ToolFailure, Turn, _image_to_analyze

    clip = {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF....WAVE").decode(),
                                                   "format": "wav"}}
    first, second = picture((1, 2, 3)), picture((4, 5, 6))
    turn = Turn(artifacts=[])
    user = {"role": "user", "content": [{"type": "text", "text": "Look"}, first, clip, second, clip]}
    assert prepared_message(user, False, turn)["content"] == (
        "Look\n[User provided image #1]\n[User provided audio file #1]\n[User provided image #2]\n"
        "[User provided audio file #2]")
    assert [c.data for c in turn.audio] == [b"RIFF....WAVE"] * 2 and turn.audio[0].format == "wav"
    assert turn.images == [first["image_url"]["url"], second["image_url"]["url"]]
    seeing = Turn(artifacts=[])
    assert prepared_message(user, True, seeing)["content"][1] == first and seeing.images == []
    assert prepared_message({"role": "assistant", "content": [first, clip]}, False, Turn(artifacts=[]))[
        "content"] == "[image]\n[audio]"
    for ref, expect in (("#1", 0), ("[User provided image #2]", 1), ("2", 1), ("#9", 1), ("https://x/y.png", 1),
                        (None, 1)):
        assert _image_to_analyze(turn, ref) == turn.images[expect], ref
    assert _image_to_analyze(turn, "data:image/png;base64,AAAA") == "data:image/png;base64,AAAA"
    made = Turn(artifacts=[Artifact("image", "image/png", b"png")])
    assert _image_to_analyze(made, "#1") == "data:image/png;base64," + base64.b64encode(b"png").decode()
    with pytest.raises(ToolFailure):
        _image_to_analyze(Turn(artifacts=[]), "#1")
