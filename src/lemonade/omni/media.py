"""Running the omni tools on a collection's components, and the media they make.

Each tool calls the same service code as the HTTP endpoint it stands for (media/: `synthesize`
behind `/v1/audio/speech`, `generate_images` and `edit_images` behind `/v1/images/*`; serving/:
`transcribe` behind `/v1/audio/transcriptions`; `analyze_image` is a chat completion of the
collection's vision model, as `/v1/chat/completions` runs one), so loading, residency and stats
work as for any request. The tools that read what the user sent (`transcribe_audio`, `analyze_image`) find it in the
`Turn`: the audio and pictures of the user's messages, numbered as their placeholders tell the LLM;
their result is text for the LLM, not a medium. A tool's failure (bad arguments, a model that
refuses) is text for the LLM ("Error: ..."), as OpenAI tool results are, so it can try again or
explain; only a client that went away stops the loop.

Media go into the assistant's `content` as openai.md says: an image as a markdown image with a
PNG data URL, speech as `<audio>data:audio/mpeg;base64,...</audio>`.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from lemonade.audio.formats import HEAD_BYTES
from lemonade.backends.image_engine import ImageEngine
from lemonade.errors import APIError
from lemonade.model_info import ModelInfo
from lemonade.services import Services
from lemonade.serving import images
from lemonade.serving.models import accepts_images, engine_path
from lemonade.serving.speech import CONTENT_TYPES, PCM_CONTENT_TYPE, speech_format, synthesize
from lemonade.serving.transcription import check_audio, check_params, transcribe

log = logging.getLogger("lemonade.omni")
SIZE_RE = re.compile(r"^\s*(\d{2,4})\s*[x×X*]\s*(\d{2,4})\s*$")
EXTENSIONS = {"image/png": "png", "audio/mpeg": "mp3", "audio/wav": "wav", "audio/ogg": "ogg", "audio/aac": "aac",
              "audio/flac": "flac", PCM_CONTENT_TYPE: "pcm"}


@dataclass
class Artifact:
    """One medium a tool made: `kind` "image" or "audio", its MIME type and bytes."""

    kind: str
    mime: str
    data: bytes

    @property
    def extension(self) -> str:
        return EXTENSIONS.get(self.mime, "bin")

    def data_url(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode()}"

    def markdown(self) -> str:
        if self.kind == "image":
            return f"![generated image]({self.data_url()})"
        return f"<audio>{self.data_url()}</audio>"


class ToolFailure(Exception):
    """A tool could not run; the message goes back to the LLM as the tool's result."""


@dataclass(frozen=True)
class Clip:
    """One audio file the user sent (`input_audio`): its bytes and the format the client named."""

    data: bytes
    format: str = ""


@dataclass
class Turn:
    """What the tools of one request share: the media made so far (in order), the conversation's last
    image, and what the user sent (audio, and pictures the LLM cannot see itself), numbered from 1."""

    artifacts: list[Artifact]
    history_image: bytes | None = None  # the last image of the conversation: what edit_image starts from
    audio: list[Clip] = field(default_factory=list)
    images: list[str] = field(default_factory=list)  # data URLs
    max_tokens: int | None = None  # the request's budget: an analysis answers within it too


def _text_arg(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ToolFailure(f"'{name}' is required: a non-empty string")
    return value.strip()


def _image_engine(svc: Services, model: ModelInfo) -> ImageEngine:
    engine = svc.engines.get(model.recipe)
    if not isinstance(engine, ImageEngine):
        raise ToolFailure(f"{model.public} is not an image model this server runs")
    return engine


def _image_settings(model: ModelInfo, args: dict[str, Any]) -> dict[str, Any]:
    """The optional image arguments the LLM gave, checked as `/v1/images/*` checks them (a wrong
    one is reported to the LLM, not guessed). A size near a valid one is rounded to it; without
    one, the model's `image_defaults` size (512x512), as `/v1/images/generations` does."""
    size = args.get("size")
    match = SIZE_RE.match(str(size)) if size is not None else None
    if match:
        size = "x".join(str(max(64, round(int(v) / 64) * 64)) for v in match.groups())
    defaults = model.image_defaults or {}
    return {"size": images.parse_size(size, (int(defaults.get("width", 512)), int(defaults.get("height", 512)))),
            "steps": images.parse_steps(args.get("steps")), "cfg_scale": images.parse_cfg_scale(args.get("cfg_scale")),
            "seed": images.parse_seed(args.get("seed"))}


def _first_png(answer: dict[str, Any], model: ModelInfo) -> bytes:
    try:
        return base64.b64decode(answer["data"][0]["b64_json"], validate=True)
    except (KeyError, IndexError, TypeError, binascii.Error, ValueError):
        raise ToolFailure(f"the image model {model.public} returned no image") from None


async def generate_image(svc: Services, model: ModelInfo, args: dict[str, Any], turn: Turn) -> tuple[str, Artifact]:
    """One PNG from the collection's image model, made by `generate_images` (the code behind
    `/v1/images/generations`); the model's own size and settings unless the LLM gave some."""
    prompt = _text_arg(args, "prompt")
    answer = await images.generate_images(svc, model, _image_engine(svc, model), prompt,
                                          **_image_settings(model, args))
    return "The image was generated and shown to the user.", Artifact("image", "image/png", _first_png(answer, model))


async def edit_image(svc: Services, model: ModelInfo, args: dict[str, Any], turn: Turn) -> tuple[str, Artifact]:
    """The most recent image (made in this turn, else the last one in the conversation) edited by
    the collection's edit model through `edit_images` (the code behind `/v1/images/edits`)."""
    prompt = _text_arg(args, "prompt")
    source = next((a.data for a in reversed(turn.artifacts) if a.kind == "image"), turn.history_image)
    if source is None:
        raise ToolFailure("there is no image in this conversation to edit; use generate_image for a new one")
    images.check_image_bytes(source, "image")
    answer = await images.edit_images(svc, model, _image_engine(svc, model), prompt, [source], None,
                                      **_image_settings(model, args))
    return "The image was edited and shown to the user.", Artifact("image", "image/png", _first_png(answer, model))


async def text_to_speech(svc: Services, model: ModelInfo, args: dict[str, Any], turn: Turn) -> tuple[str, Artifact]:
    """Speech from the collection's TTS model as mp3 (the engine's first format if it cannot encode
    mp3). A voice the model does not have is replaced by its default voice, and the LLM is told."""
    text = _text_arg(args, "input")
    voice = args.get("voice") if isinstance(args.get("voice"), str) and args["voice"].strip() else None
    fmt = speech_format(svc, model, None)
    note = ""
    try:
        audio = await synthesize(svc, model, text, voice=voice, fmt=fmt)
    except APIError as exc:
        if voice is None or not 400 <= exc.status < 500:
            raise
        log.info("omni text_to_speech: voice %r refused (%s); using the default voice", voice, exc.message)
        audio = await synthesize(svc, model, text, voice=None, fmt=fmt)
        note = f" Voice {voice!r} is not available, so the default voice spoke."
    return "The speech was generated and played to the user." + note, Artifact("audio", CONTENT_TYPES[fmt], audio)


async def transcribe_audio(svc: Services, model: ModelInfo, args: dict[str, Any],
                           turn: Turn) -> tuple[str, Artifact | None]:
    """The user's most recent audio file, transcribed by the collection's transcription model (the code
    behind `/v1/audio/transcriptions`); the transcript is the LLM's to use."""
    if not turn.audio:
        raise ToolFailure("the user sent no audio in this conversation; there is nothing to transcribe")
    language = args.get("language")
    try:
        _fmt, params = check_params(None, language if isinstance(language, str) and language.strip() else None,
                                    None, None)
    except APIError:
        params = {}  # a language this tool cannot name: the model detects it (an English-only one ignores it)
    clip = turn.audio[-1]
    check_audio(svc, model, clip.data[:HEAD_BYTES])
    result = await transcribe(svc, model, clip.data, params,
                              f"audio/{clip.format}" if clip.format else "application/octet-stream")
    return f"Transcription: {str(result.get('text', '')).strip()}", None


IMAGE_NUMBER = re.compile(r"^\s*(?:\[?\s*user provided image\s*)?#?\s*(\d+)\s*\]?\s*$", re.IGNORECASE)
ANALYSIS_MAX_TOKENS = 512  # an analysis is a paragraph for the LLM; the request's own budget wins when smaller


def _image_to_analyze(turn: Turn, reference: Any) -> str:
    """The data URL `reference` names: a data URL as given, `#N` (or `N`, or the placeholder) for the
    user's Nth picture; anything else (a web address, which the server never fetches, or a number
    the user's pictures do not reach) is the user's latest picture, as in Lemonade's app, else the
    latest image made or shown in the conversation."""
    text = reference.strip() if isinstance(reference, str) else ""
    if text.startswith("data:image/"):
        return text
    match = IMAGE_NUMBER.match(text)
    if match and 1 <= int(match.group(1)) <= len(turn.images):
        return turn.images[int(match.group(1)) - 1]
    if turn.images:
        return turn.images[-1]
    made = next((a for a in reversed(turn.artifacts) if a.kind == "image"), None)
    if made is not None:
        return made.data_url()
    if turn.history_image is not None:
        return "data:image/png;base64," + base64.b64encode(turn.history_image).decode()
    raise ToolFailure("there is no image in this conversation to analyze")


async def analyze_image(svc: Services, model: ModelInfo, args: dict[str, Any],
                        turn: Turn) -> tuple[str, Artifact | None]:
    """One picture and a question for the collection's vision model, a chat completion as
    `/v1/chat/completions` runs it (greedy: a description, not a story); its answer is the LLM's."""
    question = args.get("question")
    question = question.strip() if isinstance(question, str) and question.strip() else "Describe this image."
    if question.lower() == "describe":
        question = "Describe this image."
    url = _image_to_analyze(turn, args.get("image_url"))
    budget = min(turn.max_tokens, ANALYSIS_MAX_TOKENS) if turn.max_tokens else ANALYSIS_MAX_TOKENS
    body = {"model": model.public, "stream": False, "temperature": 0.0, "max_tokens": budget,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                      {"type": "text", "text": question}]}]}
    data = await svc.proxy.post_json(model, engine_path(svc, model, "chat/completions"), body, "chat/completions")
    answer = ((data.get("choices") or [{}])[0].get("message") or {}).get("content")
    if not isinstance(answer, str) or not answer.strip():
        raise ToolFailure(f"the vision model {model.public} gave no answer about the image")
    return f"Image analysis: {answer.strip()}", None


def _serves(svc: Services, model: ModelInfo, mode: str, endpoint: str) -> bool:
    engine = svc.engines.get(model.recipe)
    return (model.mode == mode and engine is not None and engine.available and endpoint in engine.endpoints
            and not (isinstance(engine, ImageEngine) and engine.is_upscaler(model)))


@dataclass(frozen=True)
class Runner:
    """How the server runs one built-in tool: `run` it, on a component that `serves` it."""

    run: Callable[[Services, ModelInfo, dict[str, Any], Turn], Awaitable[tuple[str, Artifact | None]]]
    serves: Callable[[Services, ModelInfo], bool]


# The tools this server can run; a built-in tool without a runner here is never offered.
RUNNERS: dict[str, Runner] = {
    "generate_image": Runner(generate_image, lambda svc, m: _serves(svc, m, "image", "images/generations")),
    "edit_image": Runner(edit_image, lambda svc, m: "edit" in m.labels and _serves(svc, m, "image", "images/edits")),
    "text_to_speech": Runner(text_to_speech, lambda svc, m: _serves(svc, m, "tts", "audio/speech")),
    "transcribe_audio": Runner(transcribe_audio,
                               lambda svc, m: _serves(svc, m, "transcription", "audio/transcriptions")),
    # a vision model other than the LLM: an LLM that sees images gets the pictures themselves (toolset.py)
    "analyze_image": Runner(analyze_image, lambda svc, m: _serves(svc, m, "chat", "chat/completions")
                            and accepts_images(svc, m)),
}


async def run_tool(svc: Services, name: str, model: ModelInfo, args: dict[str, Any],
                   turn: Turn) -> tuple[str, Artifact | None]:
    """Run tool `name` on `model`: the result text for the LLM, and the medium it made (None on failure,
    and for the tools whose result is text only)."""
    try:
        text, artifact = await RUNNERS[name].run(svc, model, args, turn)
    except ToolFailure as exc:
        return f"Error: {exc}", None
    except APIError as exc:
        log.warning("omni %s on %s failed: %s", name, model.public, exc.message)
        return f"Error: {exc.message}", None
    if artifact is not None:
        turn.artifacts.append(artifact)
    return text, artifact
