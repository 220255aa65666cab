"""`POST /v1/audio/speech` (openai.md): text in, audio out, buffered or streamed as it is made.

What a TTS engine can do is in its description (`backends/speech_engine.py`): the response formats
it encodes buffered and streamed, and the speeds it accepts; the request is checked against those
before the model is loaded. The voice is checked by the engine's worker, which knows the model's
voices (OpenAI names such as `alloy` map onto them); its 400 is passed on as ours. The default
format is `mp3` buffered and `pcm` streamed, as the spec says, or the engine's first format when it
cannot encode that. Streaming (`stream_format: "audio"`) relays the worker's PCM chunk by chunk,
one sentence at a time, so the first audio arrives before the whole text is synthesised.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from lemonade.api.errors import APIError
from lemonade.backends.speech_engine import SpeechEngine
from lemonade.model_info import ModelInfo
from lemonade.runtime.engine_request import EngineError, encode
from lemonade.services import Services

router = APIRouter(tags=["openai"])
MAX_INPUT_CHARS = 4096  # OpenAI's limit; longer texts are better sent in parts (and streamed)
# Raw PCM is declared as Lemonade declares it: 16-bit little-endian samples at 24 kHz, mono (RFC 2586's
# audio/L16 with its rate), so a player knows how to read headerless bytes.
PCM_CONTENT_TYPE = "audio/l16;rate=24000;endianness=little-endian"
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
                 "wav": "audio/wav", "pcm": PCM_CONTENT_TYPE}
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


def _choose_format(requested: str | None, supported: tuple[str, ...], default: str, streamed: bool) -> str:
    if requested is None:
        return default if default in supported else supported[0]
    if requested not in supported:
        how = "streamed" if streamed else "encoded"
        raise APIError(400, f"Invalid value for 'response_format': '{requested}' cannot be {how} by this model's "
                       f"engine. Use one of: {', '.join(supported)}", code="invalid_argument")
    return requested


AUDIO_RESPONSE = {200: {"description": "The audio, in the requested format (streamed: pcm chunks as they are made)",
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
    model = svc.check_model(svc.resolve(body.model), "tts", "/audio/speech")
    streamed = body.stream_format is not None
    if not streamed:
        fmt = speech_format(svc, model, body.response_format)
        audio = await synthesize(svc, model, body.input, voice=_voice_name(body.voice), speed=body.speed, fmt=fmt)
        return Response(audio, media_type=CONTENT_TYPES[fmt])
    engine = _speech_engine(svc, model)
    _check_speed(engine, body.speed)
    fmt = _choose_format(body.response_format, engine.stream_formats, "pcm", True)
    payload = {"input": body.input, "voice": _voice_name(body.voice), "speed": body.speed, "response_format": fmt,
               "stream": True}
    try:
        response = await svc.proxy.stream(model, svc.engine_path(model, "audio/speech"), payload, "audio/speech",
                                          media_type=CONTENT_TYPES[fmt], in_band_errors=False)
    except EngineError as exc:
        raise _refusal(exc) from None
    svc.metrics.record_inference(model.public, "audio/speech", None, None)
    return response


def _speech_engine(svc: Services, model: ModelInfo) -> SpeechEngine:
    svc.engine_path(model, "audio/speech")
    engine = svc.engines.get(model.recipe)
    if not isinstance(engine, SpeechEngine):
        raise APIError(400, f"Model {model.public} (recipe '{model.recipe}') does not serve /audio/speech",
                       code="invalid_argument")
    return engine


def _check_speed(engine: SpeechEngine, speed: float) -> None:
    low, high = engine.speed_range
    if not low <= speed <= high:
        raise APIError(400, f"Invalid value for 'speed': {speed}. This model's engine takes {low} to {high}",
                       code="invalid_argument")


def _refusal(exc: EngineError) -> APIError:
    """The worker refused the request (an unknown voice, text it cannot speak): the client's 4xx."""
    if 400 <= exc.status < 500:
        return APIError(exc.status, exc.message, code="invalid_argument")
    return exc


def speech_format(svc: Services, model: ModelInfo, requested: str | None) -> str:
    """The buffered `response_format` for `model`: `requested` if its engine encodes it (else 400), or
    the default (mp3, or the engine's first format when it cannot encode mp3)."""
    return _choose_format(requested, _speech_engine(svc, model).speech_formats, "mp3", False)


async def synthesize(svc: Services, model: ModelInfo, text: str, *, voice: str | None = None, speed: float = 1.0,
                     fmt: str = "mp3") -> bytes:
    """Buffered speech from a TTS model, the work behind a non-streamed `/v1/audio/speech` (also run by
    the omni tool loop's `text_to_speech`). `model` has passed `check_model`; `fmt` comes from
    `speech_format`. A voice or text the worker refuses is a 4xx APIError."""
    engine = _speech_engine(svc, model)
    _check_speed(engine, speed)
    payload = {"input": text, "voice": voice, "speed": speed, "response_format": fmt, "stream": False}
    try:
        audio = await svc.proxy.post_raw(model, svc.engine_path(model, "audio/speech"), encode(payload),
                                         "application/json")
    except EngineError as exc:
        raise _refusal(exc) from None
    svc.metrics.record_inference(model.public, "audio/speech", None, None)
    return audio
