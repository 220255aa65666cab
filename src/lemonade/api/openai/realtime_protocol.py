"""The realtime transcription protocol's messages (openai.md, `WS /realtime`): session settings, what
`session.update` may change, and the shape of the events we send. Pure, so it is tested alone.

`session.update` is read in the spec's shape (`model`, `turn_detection`) and in the OpenAI SDK's
shapes: `input_audio_transcription: {model, language, prompt}` (beta) and
`audio.input.{format, transcription, turn_detection}` (GA). Fields that only matter to a speaking
model (`instructions`, `voice`, ...) are accepted and ignored, so those clients need no changes.
Audio is 16 kHz mono PCM16, as the spec says; a client that declares another rate is told so.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from typing import Any

from lemonade.audio.vad import SAMPLE_RATE, VadSettings

CLIENT_EVENTS = ("session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
                 "input_audio_buffer.clear")
MAX_SILENCE_MS = 10_000
MAX_PADDING_MS = 5_000


class ProtocolError(ValueError):
    """A client message we cannot act on: sent back as an `error` event, the connection stays open."""

    def __init__(self, message: str, *, code: str = "invalid_value", param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param


@dataclass(frozen=True)
class SessionConfig:
    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    vad: VadSettings | None = field(default_factory=VadSettings)  # None: manual commits only


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def event(kind: str, **fields: Any) -> dict[str, Any]:
    """A server event: its type, a fresh `event_id`, then its fields."""
    return {"type": kind, "event_id": new_id("event"), **fields}


def error_event(message: str, *, code: str, param: str | None = None, client_event_id: str | None = None,
                type_: str = "invalid_request_error", **extra: Any) -> dict[str, Any]:
    return event("error", error={"type": type_, "code": code, "message": message, "param": param,
                                 "event_id": client_event_id}, **extra)


def session_view(session_id: str, config: SessionConfig) -> dict[str, Any]:
    """The `session` object of `session.created` / `session.updated`."""
    vad = None if config.vad is None else {"type": "server_vad", **dataclasses.asdict(config.vad)}
    return {"id": session_id, "object": "realtime.transcription_session", "model": config.model,
            "input_audio_format": "pcm16", "sample_rate": SAMPLE_RATE,
            "input_audio_transcription": {"model": config.model, "language": config.language,
                                          "prompt": config.prompt or ""},
            "turn_detection": vad}


def _number(value: Any, param: str, low: float, high: float, *, integer: bool) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (not integer or float(value).is_integer())
    if not ok or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise ProtocolError(f"Invalid value for '{param}': {value!r} ({kind} from {low:g} to {high:g})", param=param)
    return value


def _turn_detection(value: Any, current: VadSettings | None, param: str) -> VadSettings | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProtocolError(f"'{param}' must be an object (threshold, silence_duration_ms, prefix_padding_ms) or "
                            "null for manual commits", param=param)
    kind = value.get("type", "server_vad")
    if kind != "server_vad":
        raise ProtocolError(f"Invalid value for '{param}.type': {kind!r}; this server's turn detection is "
                            "'server_vad' (RMS energy), or null for manual commits", param=f"{param}.type")
    base = current or VadSettings()
    threshold = value.get("threshold", base.threshold)
    silence = value.get("silence_duration_ms", base.silence_duration_ms)
    padding = value.get("prefix_padding_ms", base.prefix_padding_ms)
    return VadSettings(
        threshold=float(_number(threshold, f"{param}.threshold", 0, 1, integer=False)),
        silence_duration_ms=int(_number(silence, f"{param}.silence_duration_ms", 20, MAX_SILENCE_MS, integer=True)),
        prefix_padding_ms=int(_number(padding, f"{param}.prefix_padding_ms", 0, MAX_PADDING_MS, integer=True)))


def _text(value: Any, param: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ProtocolError(f"'{param}' must be a string", param=param)
    return value


def _transcription(value: Any, param: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError(f"'{param}' must be an object such as {{\"model\": \"Whisper-Tiny\"}}", param=param)
    return value


def _check_format(fmt: Any, param: str) -> None:
    if fmt is None:
        return
    if isinstance(fmt, str):
        if fmt != "pcm16":
            raise ProtocolError(f"Invalid value for '{param}': {fmt!r}; only 'pcm16' (16 kHz mono) is supported",
                                param=param)
        return
    if not isinstance(fmt, dict) or fmt.get("type", "audio/pcm") != "audio/pcm":
        raise ProtocolError(f"Invalid value for '{param}': only audio/pcm (PCM16, 16 kHz mono) is supported",
                            param=param)
    if fmt.get("rate", SAMPLE_RATE) != SAMPLE_RATE:
        raise ProtocolError(f"Invalid value for '{param}.rate': {fmt.get('rate')!r}; this server takes 16000 Hz "
                            "mono PCM16 (resample on the client)", param=f"{param}.rate")


def apply_update(config: SessionConfig, session: Any) -> SessionConfig:
    """The settings after a `session.update` carrying `session`; nothing changes on a ProtocolError."""
    if not isinstance(session, dict):
        raise ProtocolError("'session' must be an object, e.g. {\"model\": \"Whisper-Tiny\"}", param="session")
    audio_input = (session.get("audio") or {}).get("input") if isinstance(session.get("audio"), dict) else None
    audio_input = audio_input if isinstance(audio_input, dict) else {}
    _check_format(session.get("input_audio_format"), "session.input_audio_format")
    _check_format(audio_input.get("format"), "session.audio.input.format")
    beta = _transcription(session.get("input_audio_transcription"), "session.input_audio_transcription")
    ga = _transcription(audio_input.get("transcription"), "session.audio.input.transcription")
    updates: dict[str, Any] = {}
    for source, prefix in ((ga, "session.audio.input.transcription"), (beta, "session.input_audio_transcription"),
                           (session, "session")):
        for key in ("model", "language", "prompt"):
            if key in source and key not in updates:
                updates[key] = _text(source[key], f"{prefix}.{key}")
    if updates.get("model") is None and "model" in updates:
        raise ProtocolError("'session.model' must name a transcription model, e.g. Whisper-Tiny",
                            param="session.model")
    if "turn_detection" in audio_input:
        updates["vad"] = _turn_detection(audio_input["turn_detection"], config.vad,
                                         "session.audio.input.turn_detection")
    elif "turn_detection" in session:
        updates["vad"] = _turn_detection(session["turn_detection"], config.vad, "session.turn_detection")
    return dataclasses.replace(config, **updates)
