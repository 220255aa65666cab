"""`WS /realtime` (openai.md): live transcription of 16 kHz mono PCM16 sent as base64 chunks.

One `RealtimeSession` per connection. Client events are read in order and answered at once
(`session.updated`, `input_audio_buffer.*`, VAD events); transcriptions run in a task of the
session, one at a time and in order, through the same path as `/v1/audio/transcriptions` (the
router loads the model on demand, keeps residency and busy protection, the engine decodes). So
speech keeps being read and turns keep being detected while an earlier turn is transcribed.

- Server VAD (default, `audio/vad.py`): `speech_started`, then every `INTERIM_MS` of speech (or
  twice as long as the last interim took, when that is more) an interim transcription of the turn
  so far as a `...transcription.delta` whose `delta` is the whole interim text (it replaces the
  previous one: the spec's "replaceable"), then on silence `speech_stopped`, `committed` and
  `...transcription.completed` with the final transcript.
- `turn_detection: null`: audio is buffered until `input_audio_buffer.commit`; no VAD or interim
  events, only `committed` and `completed`.
- Bad messages get an `error` event and the connection stays open. Authentication and the Origin
  check are the middleware's, as for every route (`?api_key=` or the `openai-insecure-api-key.`
  subprotocol on a WebSocket).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from lemonade.api.middleware import chosen_subprotocol
from lemonade.api.openai.realtime_protocol import (
    CLIENT_EVENTS,
    ProtocolError,
    SessionConfig,
    apply_update,
    error_event,
    event,
    new_id,
    session_view,
)
from lemonade.audio.formats import wav_header
from lemonade.audio.vad import SAMPLE_RATE, EnergyVad, VadSettings
from lemonade.errors import APIError
from lemonade.model_info import ModelInfo
from lemonade.runtime.request_context import ClientGone, Departure, client_gone
from lemonade.services import Services
from lemonade.serving.models import check_model, resolve
from lemonade.serving.transcription import check_params, transcribe
from lemonade.util import jsonparse

router = APIRouter(tags=["openai"])
log = logging.getLogger("lemonade.realtime")

BYTES_PER_MS = SAMPLE_RATE * 2 // 1000
INTERIM_MS = 1000  # speech between interim transcriptions of a turn in progress, at least
MAX_BUFFER_MS = 10 * 60 * 1000  # audio held for one turn; more must be committed first
MIN_COMMIT_MS = 100  # shorter buffers hold no word; OpenAI refuses them the same way


@dataclass
class Job:
    item_id: str
    pcm: bytes
    final: bool


class RealtimeSession:
    """One connection's state: settings, the audio buffer of the turn in progress, the VAD, the queue
    of transcriptions."""

    def __init__(self, ws: WebSocket, svc: Services) -> None:
        self.ws = ws
        self.svc = svc
        self.id = new_id("sess")
        self.config = SessionConfig()
        self.model: ModelInfo | None = None
        self.vad = EnergyVad(self.config.vad)
        self.buffer = bytearray()
        self.total_bytes = 0  # audio appended since the session began (the VAD's clock, in bytes)
        self.item_id: str | None = None  # the turn being spoken / buffered
        self.previous_item_id: str | None = None
        self.committed: set[str] = set()
        self.last_interim_ms = 0
        self.interim_queued = False
        self.interim_every_ms = INTERIM_MS  # twice the last interim's cost when that is more: on a slow or
        # busy machine interims get rarer, so the turn's final transcription waits less behind one
        self.jobs: asyncio.Queue[Job] = asyncio.Queue()
        self.send_lock = asyncio.Lock()
        self.gone = Departure()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.warmed: str | None = None  # the model last loaded ahead of the first turn

    # ----- sending ---------------------------------------------------------------------------------
    async def send(self, message: dict[str, Any]) -> None:
        async with self.send_lock:
            # The client left meanwhile (starlette raises RuntimeError after a close, uvicorn an OSError).
            with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
                await self.ws.send_json(message)

    async def error(self, exc: ProtocolError | APIError, client_event_id: str | None = None, **extra: Any) -> None:
        if isinstance(exc, ProtocolError):
            message = error_event(exc.message, code=exc.code, param=exc.param, client_event_id=client_event_id,
                                  **extra)
        else:
            message = error_event(exc.message, code=exc.code or "error", client_event_id=client_event_id,
                                  type_=exc.type, **extra)
        await self.send(message)

    # ----- lifecycle -------------------------------------------------------------------------------
    async def run(self, model_name: str | None) -> None:
        client_gone.set(self.gone)  # a transcription still waiting for a model slot leaves the queue with us
        self.spawn(self.transcriber())
        await self.send(event("session.created", session=session_view(self.id, self.config)))
        if model_name:
            try:
                await self.update({"model": model_name}, None, announce=False)
            except (ProtocolError, APIError) as exc:
                await self.error(exc)
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                if message.get("text") is not None:
                    await self.handle(message["text"])
                else:
                    await self.error(ProtocolError("Binary frames are not read: send audio as base64 in "
                                                   "{\"type\": \"input_audio_buffer.append\", \"audio\": ...}",
                                                   code="invalid_message"))
        except WebSocketDisconnect:
            pass
        finally:
            self.gone.set()
            for task in list(self.tasks):
                task.cancel()
            for task in list(self.tasks):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def handle(self, text: str) -> None:
        try:
            msg = jsonparse.loads(text)
        except ValueError as exc:
            await self.error(ProtocolError(f"The message is not valid JSON ({exc})", code="invalid_json"))
            return
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            await self.error(ProtocolError("Each message must be a JSON object with a string 'type'",
                                           code="invalid_message", param="type"))
            return
        kind, client_id = msg["type"], msg.get("event_id") if isinstance(msg.get("event_id"), str) else None
        try:
            if kind == "session.update":
                await self.update(msg.get("session"), client_id)
            elif kind == "input_audio_buffer.append":
                await self.append(msg.get("audio"))
            elif kind == "input_audio_buffer.commit":
                await self.commit()
            elif kind == "input_audio_buffer.clear":
                self.reset_turn()
                await self.send(event("input_audio_buffer.cleared"))
            else:
                raise ProtocolError(f"Unknown or unsupported event type '{kind}'. This server handles: "
                                    + ", ".join(CLIENT_EVENTS), code="unknown_event", param="type")
        except (ProtocolError, APIError) as exc:
            await self.error(exc, client_id)

    # ----- session.update ----------------------------------------------------------------------------
    async def update(self, session: Any, client_id: str | None, announce: bool = True) -> None:
        config = apply_update(self.config, session)
        if config.language != self.config.language or config.prompt != self.config.prompt:
            check_params(None, config.language, config.prompt, None)
        model = self.model
        if config.model != self.config.model:
            assert config.model is not None
            try:
                model = check_model(self.svc, resolve(self.svc, config.model), "transcription", "/realtime")
            except APIError as exc:
                raise ProtocolError(exc.message, code=exc.code or "invalid_model", param="session.model") from None
        if config.vad != self.config.vad:
            self.vad = EnergyVad(config.vad)
            self.vad.position_ms = self.total_bytes // BYTES_PER_MS
            self.reset_turn()
        self.config, self.model = config, model
        if announce:
            await self.send(event("session.updated", session=session_view(self.id, config)))
        if model is not None and model.name != self.warmed:
            self.warmed = model.name
            self.spawn(self.warm(model))

    async def warm(self, model: ModelInfo) -> None:
        """Load the model while the user starts speaking, so the first turn does not wait for it."""
        try:
            await self.svc.router.ensure_loaded(model, lambda: self.svc.options.resolve(model.name, model.recipe))
        except APIError as exc:
            await self.error(exc)
        except ClientGone:
            pass

    # ----- the audio buffer --------------------------------------------------------------------------
    def decode(self, audio: Any) -> bytes:
        if not isinstance(audio, str) or not audio:
            raise ProtocolError("'audio' must be a non-empty base64 string of 16 kHz mono PCM16", param="audio")
        try:
            pcm = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError("'audio' is not valid base64", code="invalid_audio", param="audio") from None
        if len(pcm) % 2:
            raise ProtocolError(f"'audio' decodes to {len(pcm)} bytes, an odd number: PCM16 has 2 bytes per "
                                "sample", code="invalid_audio", param="audio")
        return pcm

    async def append(self, audio: Any) -> None:
        pcm = self.decode(audio)
        if self.model is None:
            raise ProtocolError("No transcription model is set: connect with ?model=NAME or send session.update "
                                "with session.model before sending audio", code="model_not_set", param="session.model")
        if len(self.buffer) + len(pcm) > MAX_BUFFER_MS * BYTES_PER_MS:
            raise ProtocolError(f"The audio buffer is full ({MAX_BUFFER_MS // 60000} minutes): commit or clear it",
                                code="input_audio_buffer_full")
        if self.item_id is None:
            self.item_id = new_id("item")
        self.buffer += pcm
        self.total_bytes += len(pcm)
        settings = self.config.vad
        if settings is None:
            return
        for ev in self.vad.feed(pcm):
            if ev.kind == "speech_started":
                self.last_interim_ms = ev.ms
                self.item_id = self.item_id or new_id("item")
                await self.send(event("input_audio_buffer.speech_started", audio_start_ms=ev.ms,
                                      item_id=self.item_id))
            else:
                await self.send(event("input_audio_buffer.speech_stopped", audio_end_ms=ev.ms,
                                      item_id=self.item_id))
                await self.commit()
        if not self.vad.speaking:
            self.trim(settings)
        elif self.vad.position_ms - self.last_interim_ms >= self.interim_every_ms and not self.interim_queued:
            self.last_interim_ms = self.vad.position_ms
            self.interim_queued = True
            assert self.item_id is not None
            self.jobs.put_nowait(Job(self.item_id, bytes(self.buffer), final=False))

    def trim(self, settings: VadSettings) -> None:
        """Between turns only the padding before a (possible) onset is worth keeping."""
        start_ms = (self.total_bytes - len(self.buffer)) // BYTES_PER_MS
        drop = (self.vad.keep_from_ms() - start_ms) * BYTES_PER_MS
        if drop > 0:
            del self.buffer[:drop]

    def reset_turn(self) -> None:
        self.buffer.clear()
        self.vad.reset()
        self.item_id = None

    async def commit(self) -> None:
        if len(self.buffer) < MIN_COMMIT_MS * BYTES_PER_MS:
            raise ProtocolError(f"The audio buffer holds {len(self.buffer) // BYTES_PER_MS} ms of audio; at least "
                                f"{MIN_COMMIT_MS} ms are needed to commit", code="input_audio_buffer_commit_empty")
        item_id = self.item_id or new_id("item")
        await self.send(event("input_audio_buffer.committed", previous_item_id=self.previous_item_id,
                              item_id=item_id))
        self.committed.add(item_id)
        self.jobs.put_nowait(Job(item_id, bytes(self.buffer), final=True))
        self.previous_item_id = item_id
        self.reset_turn()

    # ----- transcriptions, one at a time -------------------------------------------------------------
    async def transcriber(self) -> None:
        while True:
            job = await self.jobs.get()
            if not job.final:
                self.interim_queued = False
                if job.item_id in self.committed:
                    continue  # the turn ended meanwhile: its final transcript is on the way
            model = self.model
            if model is None:
                continue
            params = {k: v for k, v in (("language", self.config.language), ("prompt", self.config.prompt)) if v}
            started = time.monotonic()
            try:
                result = await transcribe(self.svc, model, wav_header(len(job.pcm)) + job.pcm, params, "audio/wav")
            except APIError as exc:
                log.warning("Realtime transcription with %s failed: %s", model.public, exc.message)
                if job.final:
                    self.committed.discard(job.item_id)
                    await self.error(exc, item_id=job.item_id)
                continue
            text = str(result.get("text", "")).strip()
            if not job.final:
                self.interim_every_ms = max(INTERIM_MS, int(2000 * (time.monotonic() - started)))
                if text:  # still ahead of the turn's `completed`, which waits behind it in the queue
                    await self.send(event("conversation.item.input_audio_transcription.delta", item_id=job.item_id,
                                          content_index=0, delta=text))
                continue
            self.committed.discard(job.item_id)
            await self.send(event("conversation.item.input_audio_transcription.completed", item_id=job.item_id,
                                  content_index=0, transcript=text))


@router.websocket("/realtime")
async def realtime(ws: WebSocket, model: str | None = None) -> None:
    await ws.accept(subprotocol=chosen_subprotocol(ws.scope))
    await RealtimeSession(ws, ws.app.state.services).run(model)
