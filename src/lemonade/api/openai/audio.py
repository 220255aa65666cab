"""`POST /v1/audio/transcriptions` (openai.md): multipart audio in, text out.

WAV as the spec requires, and mp3, flac, ogg and webm besides (`audio/formats.py` recognises the
container from the first bytes; the engine decodes and resamples to 16 kHz mono). The engine
returns segments with timestamps; the transcription, the checks made before any model loads and the
response formats (json, verbose_json, text, srt, vtt, the same for every transcription engine) are
`serving/transcription.py`, shared with the other callers.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.datastructures import UploadFile

from lemonade.api.errors import APIError
from lemonade.audio import formats
from lemonade.runtime.engine_request import FileBody
from lemonade.services import Services
from lemonade.serving.models import check_model, resolve
from lemonade.serving.transcription import check_audio, check_params, shaped, transcribe

router = APIRouter(tags=["openai"])
MAX_FIELD_BYTES = 1024 * 1024  # the text fields (a prompt); the file part is spooled to disk, bounded by
# max_request_body_mb (api/middleware.py)


def _field(form: Any, name: str) -> str | None:
    value = form.get(name)
    if value is None or isinstance(value, UploadFile):
        return None if value is None else ""
    return str(value)


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
    model = check_model(svc, resolve(svc, name), "transcription", "/audio/transcriptions")
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
