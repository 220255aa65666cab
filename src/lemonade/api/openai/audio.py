"""`POST /v1/audio/transcriptions` (openai.md): multipart audio in, text out.

WAV as the spec requires, and mp3, flac, ogg and webm besides (`audio/formats.py` recognises the
container from the first bytes; the engine decodes and resamples to 16 kHz mono). The engine
returns segments with timestamps; the response formats (json, verbose_json, text, srt, vtt) are
made here, so every transcription engine answers alike.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.datastructures import UploadFile

from lemonade.api.errors import APIError
from lemonade.audio import formats
from lemonade.model_info import ModelInfo
from lemonade.runtime.engine_request import FileBody
from lemonade.services import Services

router = APIRouter(tags=["openai"])
RESPONSE_FORMATS = ("json", "verbose_json", "text", "srt", "vtt")
MAX_FIELD_BYTES = 1024 * 1024  # the text fields (a prompt); the file part is spooled to disk, bounded by
# max_request_body_mb (api/middleware.py)
LANGUAGE_RE = re.compile(r"^[A-Za-z]{2,3}$")


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


def _field(form: Any, name: str) -> str | None:
    value = form.get(name)
    if value is None or isinstance(value, UploadFile):
        return None if value is None else ""
    return str(value)


async def transcribe(svc: Services, model: ModelInfo, audio: bytes | FileBody, params: dict[str, str],
                     content_type: str = "application/octet-stream") -> dict[str, Any]:
    """One transcription through the router and the model's engine (the HTTP route, the realtime
    API and the MCP tool all come here): `{"text", "language", "duration", "segments"}`.
    `content_type`: the audio's, as the client said it (an engine may pass it on)."""
    path = svc.engine_path(model, "audio/transcriptions") + ("?" + urlencode(params) if params else "")
    result = json.loads(await svc.proxy.post_raw(model, path, audio, content_type))
    svc.metrics.record_inference(model.public, "audio/transcriptions", None, None)
    return result


def shaped(result: dict[str, Any], fmt: str) -> tuple[str | dict[str, Any], str]:
    """An engine's result in one of RESPONSE_FORMATS: (JSON object or text, media type)."""
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
            value = float(temperature)  # type: ignore[arg-type]
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


@router.post("/audio/transcriptions")
async def transcriptions(request: Request) -> Response:
    """The upload stays in starlette's spooled file (memory up to 1 MB, then disk) and is streamed
    from there to the engine; its first bytes are checked before any model is loaded."""
    svc: Services = request.app.state.services
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise APIError(400, "Send the audio as multipart/form-data with fields 'file' and 'model'",
                       code="invalid_argument")
    form = await request.form(max_part_size=MAX_FIELD_BYTES)
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise APIError(400, "Missing required field 'file' (the audio file, as a multipart file part)",
                       code="missing_argument")
    name = _field(form, "model")
    if not name:
        raise APIError(400, "Missing required field 'model'", code="missing_argument")
    fmt, params = check_params(_field(form, "response_format"), _field(form, "language"),
                               _field(form, "prompt"), _field(form, "temperature"))
    model = svc.check_model(svc.resolve(name), "transcription", "/audio/transcriptions")
    head = await upload.read(formats.HEAD_BYTES)
    check_audio(svc, model, head)
    size = upload.size if upload.size is not None else await asyncio.to_thread(_size, upload.file)
    result = await transcribe(svc, model, FileBody(upload.file, size), params,
                              upload.content_type or "application/octet-stream")
    body, media_type = shaped(result, fmt)
    if isinstance(body, dict):
        return JSONResponse(body)
    return PlainTextResponse(body, media_type=media_type)


def _size(file: Any) -> int:
    file.seek(0, 2)
    return int(file.tell())
