"""Running the omni tools on a collection's components, and the media they make.

Each tool calls the same service code as the HTTP endpoint it stands for (`synthesize` behind
`/v1/audio/speech`; the image engine's generations endpoint behind `/v1/images/generations`), so
loading, residency and stats work as for any request. A tool's failure (bad arguments, a model that
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
from dataclasses import dataclass
from typing import Any

from lemonade.api.openai.speech import CONTENT_TYPES, speech_format, synthesize
from lemonade.errors import APIError
from lemonade.model_info import ModelInfo
from lemonade.services import Services

log = logging.getLogger("lemonade.omni")
SIZE_RE = re.compile(r"^\s*(\d{2,4})\s*[x×X*]\s*(\d{2,4})\s*$")
EXTENSIONS = {"image/png": "png", "audio/mpeg": "mp3", "audio/wav": "wav", "audio/ogg": "ogg", "audio/aac": "aac",
              "audio/flac": "flac", "audio/pcm": "pcm"}


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


@dataclass
class Turn:
    """What the tools of one request share: the media made so far (in order)."""

    artifacts: list[Artifact]
    history_image: bytes | None = None  # the conversation's last image: what an edit starts from


def _text_arg(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ToolFailure(f"'{name}' is required: a non-empty string")
    return value.strip()


def _image_options(args: dict[str, Any]) -> dict[str, Any]:
    """The optional image arguments the LLM gave, checked (a wrong one is reported, not guessed)."""
    out: dict[str, Any] = {}
    if args.get("size") is not None:
        match = SIZE_RE.match(str(args["size"]))
        if not match:
            raise ToolFailure(f"'size' must look like 512x512, got {args['size']!r}; leave it out for the default")
        width, height = (max(64, round(int(v) / 64) * 64) for v in match.groups())
        out["size"] = f"{width}x{height}"
    for name, kind in (("steps", int), ("seed", int), ("cfg_scale", float)):
        value = args.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
            raise ToolFailure(f"'{name}' must be a {'whole ' if kind is int else ''}number, got {value!r}")
        out[name] = kind(value)
    if "steps" in out and not 1 <= out["steps"] <= 100:
        raise ToolFailure("'steps' must be 1 to 100")
    return out


async def generate_image(svc: Services, model: ModelInfo, args: dict[str, Any], turn: Turn) -> tuple[str, Artifact]:
    """One PNG from the collection's image model, through its engine's `images/generations` endpoint
    (the path `/v1/images/generations` takes); the model's own size unless the LLM gave one."""
    body = {"prompt": _text_arg(args, "prompt"), "n": 1, "response_format": "b64_json", **_image_options(args)}
    data = await svc.proxy.post_json(model, svc.engine_path(model, "images/generations"), body, "images/generations")
    try:
        png = base64.b64decode(data["data"][0]["b64_json"], validate=True)
    except (KeyError, IndexError, TypeError, binascii.Error, ValueError):
        raise ToolFailure(f"the image model {model.public} returned no image") from None
    return "The image was generated and shown to the user.", Artifact("image", "image/png", png)


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


def _serves(svc: Services, model: ModelInfo, mode: str, endpoint: str) -> bool:
    engine = svc.engines.get(model.recipe)
    return (model.mode == mode and engine is not None and engine.available and endpoint in engine.endpoints)


@dataclass(frozen=True)
class Runner:
    """How the server runs one built-in tool: `run` it, on a component that `serves` it."""

    run: Callable[[Services, ModelInfo, dict[str, Any], Turn], Awaitable[tuple[str, Artifact]]]
    serves: Callable[[Services, ModelInfo], bool]


# The tools this server can run; a built-in tool without a runner here is never offered.
RUNNERS: dict[str, Runner] = {
    "generate_image": Runner(generate_image, lambda svc, m: _serves(svc, m, "image", "images/generations")),
    "text_to_speech": Runner(text_to_speech, lambda svc, m: _serves(svc, m, "tts", "audio/speech")),
}


async def run_tool(svc: Services, name: str, model: ModelInfo, args: dict[str, Any],
                   turn: Turn) -> tuple[str, Artifact | None]:
    """Run tool `name` on `model`: the result text for the LLM, and the medium it made (None on failure)."""
    try:
        text, artifact = await RUNNERS[name].run(svc, model, args, turn)
    except ToolFailure as exc:
        return f"Error: {exc}", None
    except APIError as exc:
        log.warning("omni %s on %s failed: %s", name, model.public, exc.message)
        return f"Error: {exc.message}", None
    turn.artifacts.append(artifact)
    return text, artifact
