"""`POST /v1/audio/transcriptions` (openai.md): multipart audio in, text out.

The engine returns segments with timestamps; the response formats (json, verbose_json, text, srt,
vtt) are made here, so every transcription engine answers alike.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.datastructures import UploadFile

from lemonade.api.errors import APIError
from lemonade.services import Services

router = APIRouter(tags=["openai"])
RESPONSE_FORMATS = ("json", "verbose_json", "text", "srt", "vtt")
MAX_AUDIO_BYTES = 512 * 1024 * 1024


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


@router.post("/audio/transcriptions")
async def transcriptions(request: Request) -> Response:
    svc: Services = request.app.state.services
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise APIError(400, "Send the audio as multipart/form-data with fields 'file' and 'model'",
                       code="invalid_argument")
    form = await request.form(max_part_size=MAX_AUDIO_BYTES)
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise APIError(400, "Missing required field 'file' (the audio file, as a multipart file part)",
                       code="missing_argument")
    name = _field(form, "model")
    if not name:
        raise APIError(400, "Missing required field 'model'", code="missing_argument")
    fmt = _field(form, "response_format") or "json"
    if fmt not in RESPONSE_FORMATS:
        raise APIError(400, f"Invalid value for 'response_format': '{fmt}'. Use one of: {', '.join(RESPONSE_FORMATS)}",
                       code="invalid_argument")
    params: dict[str, str] = {}
    for key in ("language", "prompt", "temperature"):
        value = _field(form, key)
        if value:
            params[key] = value
    if "temperature" in params:
        try:
            if not 0 <= float(params["temperature"]) <= 1:
                raise ValueError
        except ValueError:
            raise APIError(400, f"Invalid value for 'temperature': '{params['temperature']}' (a number from 0 to 1)",
                           code="invalid_argument") from None
    model = svc.check_model(svc.resolve(name), "transcription", "/audio/transcriptions")
    audio = await upload.read()
    if not audio:
        raise APIError(400, "Invalid value for 'file': the uploaded file is empty", code="invalid_argument")
    path = svc.engine_path(model, "audio/transcriptions") + ("?" + urlencode(params) if params else "")
    result = json.loads(await svc.proxy.post_raw(model, path, audio, upload.content_type or
                                                 "application/octet-stream"))
    svc.metrics.record_inference(model.public, "audio/transcriptions", None, None)
    text = result.get("text", "")
    if fmt == "text":
        return PlainTextResponse(text + "\n")
    if fmt in ("srt", "vtt"):
        return PlainTextResponse(subtitles(result.get("segments", []), fmt),
                                 media_type="text/vtt" if fmt == "vtt" else "application/x-subrip")
    if fmt == "verbose_json":
        return JSONResponse({"task": "transcribe", "language": result.get("language"),
                             "duration": result.get("duration"), "text": text,
                             "segments": result.get("segments", [])})
    return JSONResponse({"text": text})
