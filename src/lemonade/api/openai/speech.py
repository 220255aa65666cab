"""`POST /v1/audio/speech` (openai.md): text in, audio out, buffered or streamed as it is made.

What a TTS engine can do is in its description (`backends/speech_engine.py`): the response formats
it encodes buffered and streamed, and the speeds it accepts; the request is checked against those
before the model is loaded (serving/speech.py, which also makes the buffered audio). The voice is
checked by the engine's worker, which knows the model's voices (OpenAI names such as `alloy` map
onto them); its 400 is passed on as ours. The default format is `mp3` buffered and `pcm` streamed,
as the spec says, or the engine's first format when it cannot encode that. Streaming
(`stream_format: "audio"`) relays the worker's PCM chunk by chunk, one sentence at a time, so the
first audio arrives before the whole text is synthesised.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from lemonade.api.errors import APIError
from lemonade.api.relay import response
from lemonade.runtime.engine_request import EngineError
from lemonade.services import Services
from lemonade.serving.models import check_model, engine_path, resolve
from lemonade.serving.speech import (
    CONTENT_TYPES,
    check_speed,
    choose_format,
    refusal,
    speech_engine,
    speech_format,
    synthesize,
)

router = APIRouter(tags=["openai"])
MAX_INPUT_CHARS = 4096  # OpenAI's limit; longer texts are better sent in parts (and streamed)
STREAM_FORMATS = ("audio",)


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: str = Field(..., min_length=1, examples=["kokoro-v1"])
    input: str = Field(..., min_length=1, max_length=MAX_INPUT_CHARS, description="The text to speak")
    voice: str | dict[str, Any] | None = Field(None, description="An OpenAI voice name (alloy, echo, ...) or one "
                                               "of the model's own voices (also as {\"id\": name}). Default: shimmer")
    speed: float = Field(1.0, description="Speaking speed; 1.0 is normal")
    response_format: str | None = Field(None, description="mp3 (default buffered), opus, aac, flac, wav or pcm "
                                        "(default streamed; 24 kHz 16-bit mono); which ones depends on the engine")
    stream_format: str | None = Field(None, description="'audio': stream the audio as it is synthesised")


def _voice_name(voice: str | dict[str, Any] | None) -> str | None:
    """The voice as a name: the OpenAI SDK may send a custom voice as `{"id": ...}`."""
    if isinstance(voice, dict):
        voice = voice.get("id")
        if not isinstance(voice, str):
            raise APIError(400, "Invalid value for 'voice': an object voice needs a string 'id'",
                           code="invalid_argument")
    if voice is not None and not voice.strip():
        raise APIError(400, "Invalid value for 'voice': the voice name is empty", code="invalid_argument")
    return voice


AUDIO_RESPONSE: dict[int | str, dict[str, Any]] = {200: {
    "description": "The audio, in the requested format (streamed: pcm chunks as they are made)",
    "content": {media: {"schema": {"type": "string", "format": "binary"}}
                for media in dict.fromkeys(CONTENT_TYPES.values())}}}


@router.post("/audio/speech", response_class=Response, responses=AUDIO_RESPONSE)
async def speech(request: Request, body: SpeechRequest) -> Response:
    svc: Services = request.app.state.services
    if not body.input.strip():
        raise APIError(400, "Invalid value for 'input': the text to speak is blank", code="invalid_argument")
    if body.stream_format is not None and body.stream_format not in STREAM_FORMATS:
        raise APIError(400, f"Invalid value for 'stream_format': '{body.stream_format}'. Only 'audio' is supported "
                       "(omit it for a buffered response)", code="invalid_argument")
    model = check_model(svc, resolve(svc, body.model), "tts", "/audio/speech")
    streamed = body.stream_format is not None
    if not streamed:
        fmt = speech_format(svc, model, body.response_format)
        audio = await synthesize(svc, model, body.input, voice=_voice_name(body.voice), speed=body.speed, fmt=fmt)
        return Response(audio, media_type=CONTENT_TYPES[fmt])
    engine = speech_engine(svc, model)
    check_speed(engine, body.speed)
    fmt = choose_format(body.response_format, engine.stream_formats, "pcm", True)
    payload = {"input": body.input, "voice": _voice_name(body.voice), "speed": body.speed, "response_format": fmt,
               "stream": True}
    try:
        relay = await svc.proxy.stream(model, engine_path(svc, model, "audio/speech"), payload, "audio/speech",
                                       media_type=CONTENT_TYPES[fmt], in_band_errors=False)
    except EngineError as exc:
        raise refusal(exc) from None
    svc.metrics.record_inference(model.public, "audio/speech", None, None)
    return response(relay)


