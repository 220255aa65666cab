"""Speech through the router: what a TTS engine can make, checked before the model loads, and the
buffered synthesis behind `/v1/audio/speech` (api/openai/speech.py), also run by the omni tool
loop's `text_to_speech`.

What a TTS engine can do is in its description (`backends/speech_engine.py`): the response formats
it encodes buffered and streamed, and the speeds it accepts. The default format is `mp3` buffered
and `pcm` streamed, as the spec says, or the engine's first format when it cannot encode that.
"""

from __future__ import annotations

from lemonade.backends.speech_engine import SpeechService
from lemonade.errors import APIError
from lemonade.model_info import ModelInfo
from lemonade.runtime.engine_request import EngineError
from lemonade.services import Services
from lemonade.serving.models import engine_path

# Raw PCM is declared as Lemonade declares it: 16-bit little-endian samples at 24 kHz, mono (RFC 2586's
# audio/L16 with its rate), so a player knows how to read headerless bytes.
PCM_CONTENT_TYPE = "audio/l16;rate=24000;endianness=little-endian"
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
                 "wav": "audio/wav", "pcm": PCM_CONTENT_TYPE}


def choose_format(requested: str | None, supported: tuple[str, ...], default: str, streamed: bool) -> str:
    if requested is None:
        return default if default in supported else supported[0]
    if requested not in supported:
        how = "streamed" if streamed else "encoded"
        raise APIError(400, f"Invalid value for 'response_format': '{requested}' cannot be {how} by this model's "
                       f"engine. Use one of: {', '.join(supported)}", code="invalid_argument")
    return requested


def speech_engine(svc: Services, model: ModelInfo) -> SpeechService:
    engine_path(svc, model, "audio/speech")
    engine = svc.engines.get(model.recipe)
    if not isinstance(engine, SpeechService):
        raise APIError(400, f"Model {model.public} (recipe '{model.recipe}') does not serve /audio/speech",
                       code="invalid_argument")
    return engine


def check_speed(engine: SpeechService, speed: float) -> None:
    low, high = engine.speed_range
    if not low <= speed <= high:
        raise APIError(400, f"Invalid value for 'speed': {speed}. This model's engine takes {low} to {high}",
                       code="invalid_argument")


def refusal(exc: EngineError) -> APIError:
    """The worker refused the request (an unknown voice, text it cannot speak): the client's 4xx."""
    if 400 <= exc.status < 500:
        return APIError(exc.status, exc.message, code="invalid_argument")
    return exc


def speech_format(svc: Services, model: ModelInfo, requested: str | None) -> str:
    """The buffered `response_format` for `model`: `requested` if its engine encodes it (else 400), or
    the default (mp3, or the engine's first format when it cannot encode mp3)."""
    return choose_format(requested, speech_engine(svc, model).speech_formats, "mp3", False)


async def synthesize(svc: Services, model: ModelInfo, text: str, *, voice: str | None = None, speed: float = 1.0,
                     fmt: str = "mp3") -> bytes:
    """Buffered speech from a TTS model, the work behind a non-streamed `/v1/audio/speech` (also run by
    the omni tool loop's `text_to_speech`). `model` has passed `check_model`; `fmt` comes from
    `speech_format`. A voice or text the worker refuses is a 4xx APIError."""
    engine = speech_engine(svc, model)
    check_speed(engine, speed)
    payload = {"input": text, "voice": voice, "speed": speed, "response_format": fmt, "stream": False}
    try:
        audio = await svc.proxy.post_raw(model, engine_path(svc, model, "audio/speech"), payload, "application/json")
    except EngineError as exc:
        raise refusal(exc) from None
    svc.metrics.record_inference(model.public, "audio/speech", None, None)
    return audio
