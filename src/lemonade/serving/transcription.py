"""Speech to text through the router: the transcription behind `/v1/audio/transcriptions`
(api/openai/audio.py), also run by the realtime API, MCP's `lemonade_transcribe_audio` and the omni
tool loop's `transcribe_audio`, and the response formats the first two answer in.

What is checked before any model loads is here too: the fields a transcription takes (language,
prompt, temperature) and the audio's container, read from its first bytes (`audio/formats.py`) and
matched against what the model's engine decodes.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlencode

from lemonade.audio import formats
from lemonade.errors import APIError
from lemonade.model_info import ModelInfo
from lemonade.runtime.engine_request import FileBody
from lemonade.services import Services
from lemonade.serving.models import engine_path

RESPONSE_FORMATS = ("json", "verbose_json", "text", "srt", "vtt")
LANGUAGE_RE = re.compile(r"^[A-Za-z]{2,3}$")


async def transcribe(svc: Services, model: ModelInfo, audio: bytes | FileBody, params: dict[str, str],
                     content_type: str = "application/octet-stream") -> dict[str, Any]:
    """One transcription through the router and the model's engine: `{"text", "language", "duration",
    "segments"}`. `content_type`: the audio's, as the client said it (an engine may pass it on)."""
    path = engine_path(svc, model, "audio/transcriptions") + ("?" + urlencode(params) if params else "")
    result = json.loads(await svc.proxy.post_raw(model, path, audio, content_type))
    svc.metrics.record_inference(model.public, "audio/transcriptions", None, None)
    return result


def _timestamp(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def subtitles(segments: list[dict[str, Any]], fmt: str) -> str:
    """SRT or WebVTT cues, one per segment."""
    sep = "," if fmt == "srt" else "."
    cues = []
    for i, seg in enumerate(segments, 1):
        span = f"{_timestamp(seg['start'], sep)} --> {_timestamp(seg['end'], sep)}"
        text = seg["text"].strip()
        cues.append(f"{i}\n{span}\n{text}\n" if fmt == "srt" else f"{span}\n{text}\n")
    return ("WEBVTT\n\n" if fmt == "vtt" else "") + "\n".join(cues)


def shaped(result: dict[str, Any], fmt: str) -> tuple[str | dict[str, Any], str]:
    """An engine's result in one of `RESPONSE_FORMATS`, the same for every engine: (JSON object or text, media
    type). MCP's `lemonade_transcribe_audio` returns it as the full OpenAI-shaped response."""
    text = result.get("text", "")
    if fmt == "text":
        return text + "\n", "text/plain"
    if fmt in ("srt", "vtt"):  # text/plain, as OpenAI's API and Lemonade's server send subtitles
        return subtitles(result.get("segments", []), fmt), "text/plain"
    if fmt == "verbose_json":
        return {"task": "transcribe", "language": result.get("language"), "duration": result.get("duration"),
                "text": text, "segments": result.get("segments", [])}, "application/json"
    return {"text": text}, "application/json"


def check_params(fmt: str | None, language: str | None, prompt: str | None,
                 temperature: str | float | None) -> tuple[str, dict[str, str]]:
    """(response format, engine query parameters), or a 400 naming the bad field."""
    fmt = fmt or "json"
    if fmt not in RESPONSE_FORMATS:
        raise APIError(400, f"Invalid value for 'response_format': '{fmt}'. Use one of: {', '.join(RESPONSE_FORMATS)}",
                       code="invalid_argument")
    params: dict[str, str] = {}
    if language:
        if not LANGUAGE_RE.match(language):
            raise APIError(400, f"Invalid value for 'language': '{language}' (an ISO 639-1 code such as 'en')",
                           code="invalid_argument")
        params["language"] = language.lower()
    if prompt:
        params["prompt"] = prompt
    if temperature not in (None, ""):
        try:
            value = float(temperature)
            if not 0 <= value <= 1:
                raise ValueError
        except (TypeError, ValueError):
            raise APIError(400, f"Invalid value for 'temperature': '{temperature}' (a number from 0 to 1)",
                           code="invalid_argument") from None
        params["temperature"] = str(value)
    return fmt, params


def check_audio(svc: Services, model: ModelInfo, head: bytes) -> str:
    """The container of an upload starting with `head`, or a 400 saying why it is refused (not audio,
    or a container the model's engine does not decode)."""
    try:
        kind = formats.check(head)
    except formats.AudioFormatError as exc:
        raise APIError(400, f"Invalid value for 'file': {exc}", code="invalid_audio") from None
    engine = svc.engines.get(model.recipe)
    accepted = engine.audio_formats if engine is not None else formats.FORMATS
    if kind not in accepted:
        raise APIError(400, f"Invalid value for 'file': {model.public} (recipe '{model.recipe}') reads "
                       f"{', '.join(accepted)} audio, not {kind}; convert the file or use another model",
                       code="unsupported_audio_format")
    return kind
