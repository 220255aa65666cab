"""`WS /realtime` (openai.md) on the real faster-whisper engine with Whisper tiny.en: espeak-ng speech
with silence around it, sent as 85 ms PCM16 chunks (16 kHz mono, base64) at the pace of a
microphone, by the `websockets` client and by the official `openai` SDK's realtime client.

Checked: the VAD events in order with their audio times, `committed`, interim `delta`s, the final
`completed` transcript (word error rate <= 10%), manual commits with `turn_detection: null` (no
VAD or interim events), `error` events for every bad message without losing the connection, the
model going through the router (loaded on demand), every path and prefix, the dedicated WebSocket
port of `/v1/health`, and the key and Origin rules on both ports.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import httpx
import openai
import pytest
import websockets
from websockets.asyncio.client import connect

from tests.helpers import (
    CHUNK_BYTES,
    TRANSCRIPTION,
    WHISPER,
    Server,
    ServerFactory,
    loaded,
    publish_whisper,
    recv,
    send,
    session,
    stream,
    until,
    ws_url,
)
from tests.speech import SENTENCE, loud_span_ms, pcm16, speak, wer

MAX_WER = 0.10
LEAD_MS, TAIL_MS = 1000, 1500
KEY = "rt-s3cret"


@pytest.fixture(scope="module")
def factory(tmp_path_factory) -> ServerFactory:
    f = ServerFactory(tmp_path_factory, None)
    yield f
    f.close()


@pytest.fixture(scope="module")
def server(factory, hub_server, whisper_backend, whisper_ct2_dir) -> Server:
    publish_whisper(hub_server, whisper_ct2_dir)
    return factory(env=hub_server.env(), engines=("fasterwhisper",))


@pytest.fixture(scope="module")
def keyed(factory, hub_server, whisper_backend) -> Server:
    return factory(env={**hub_server.env(), "LEMONADE_API_KEY": KEY}, engines=("fasterwhisper",))


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> bytes:
    """SENTENCE with 1 s of silence before and 1.5 s after, as raw PCM16."""
    return pcm16(speak(SENTENCE, tmp_path_factory.mktemp("rt") / "stella.wav", lead_ms=LEAD_MS, tail_ms=TAIL_MS))


def test_vad_turn_transcribed_with_events_in_order(server, speech):
    async def run() -> list[dict[str, Any]]:
        async with session(ws_url(server, model=WHISPER)) as ws:
            sender = asyncio.create_task(stream(ws, speech))
            events = await until(ws, f"{TRANSCRIPTION}.completed", timeout=180)
            await sender
            return events

    events = asyncio.run(run())
    kinds = [e["type"] for e in events]
    assert [k for k in kinds if "delta" not in k] == [
        "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
        f"{TRANSCRIPTION}.completed"], kinds
    started, stopped, committed, completed = (e for e in events if "delta" not in e["type"])
    deltas = [e for e in events if e["type"] == f"{TRANSCRIPTION}.delta"]
    assert deltas, "interim transcriptions arrive while the sentence is spoken"
    item = started["item_id"]
    assert {e["item_id"] for e in (stopped, committed, completed, *deltas)} == {item}
    assert committed["previous_item_id"] is None
    assert all(isinstance(d["delta"], str) and d["delta"] for d in deltas)
    first, last = loud_span_ms(speech)  # espeak-ng adds quiet of its own around the words
    assert abs(started["audio_start_ms"] - first) <= 20, (started, first)  # the VAD's frames are 20 ms
    assert abs(stopped["audio_end_ms"] - last) <= 20, (stopped, last)
    assert wer(SENTENCE, completed["transcript"]) <= MAX_WER, completed["transcript"]
    assert all(e["event_id"].startswith("event_") for e in events)


def test_manual_commit_mode(server, speech):
    async def run() -> tuple[list[dict[str, Any]], ...]:
        async with session(ws_url(server, path="/realtime")) as ws:
            await send(ws, "session.update", session={"model": WHISPER, "turn_detection": None})
            updated = await recv(ws)
            await stream(ws, speech, pace=0)  # as fast as it goes: nothing comes back until the commit
            await send(ws, "input_audio_buffer.commit")
            events = await until(ws, f"{TRANSCRIPTION}.completed")
            await send(ws, "input_audio_buffer.commit")
            empty = await recv(ws)
            await stream(ws, speech[:CHUNK_BYTES * 4], pace=0)
            await send(ws, "input_audio_buffer.clear")
            cleared = await recv(ws)
            await send(ws, "input_audio_buffer.commit")  # the clear left nothing to commit
            after_clear = await recv(ws)
            return [updated], events, [empty, cleared, after_clear]

    (updated,), events, (empty, cleared, after_clear) = asyncio.run(run())
    assert updated["type"] == "session.updated" and updated["session"]["turn_detection"] is None
    assert updated["session"]["model"] == WHISPER
    assert [e["type"] for e in events] == ["input_audio_buffer.committed", f"{TRANSCRIPTION}.completed"]
    assert events[0]["item_id"] == events[1]["item_id"]
    assert wer(SENTENCE, events[1]["transcript"]) <= MAX_WER, events[1]["transcript"]
    assert empty["type"] == "error" and empty["error"]["code"] == "input_audio_buffer_commit_empty"
    assert cleared["type"] == "input_audio_buffer.cleared"
    assert after_clear["type"] == "error" and after_clear["error"]["code"] == "input_audio_buffer_commit_empty"


def test_vad_settings_from_session_update(server, speech):
    """A threshold above the speech's loudness: no turn is ever detected; back to a normal one: it is."""
    async def run() -> tuple[dict[str, Any], list[str], list[dict[str, Any]]]:
        async with session(ws_url(server, path="/api/v1/realtime", model=WHISPER)) as ws:
            await send(ws, "session.update", session={"turn_detection": {"threshold": 0.9, "silence_duration_ms": 500,
                                                                         "prefix_padding_ms": 100}})
            updated = await recv(ws)
            await stream(ws, speech, pace=0)
            await send(ws, "input_audio_buffer.clear")
            quiet = [e["type"] for e in await until(ws, "input_audio_buffer.cleared")]
            await send(ws, "session.update", session={"turn_detection": {"threshold": 0.01}})
            await recv(ws)
            await stream(ws, speech, pace=0)
            return updated, quiet, await until(ws, f"{TRANSCRIPTION}.completed")

    updated, quiet, events = asyncio.run(run())
    assert updated["session"]["turn_detection"] == {"type": "server_vad", "threshold": 0.9,
                                                    "silence_duration_ms": 500, "prefix_padding_ms": 100}
    assert quiet == ["input_audio_buffer.cleared"]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "input_audio_buffer.speech_started" and "input_audio_buffer.speech_stopped" in kinds
    stopped = next(e for e in events if e["type"] == "input_audio_buffer.speech_stopped")
    # audio times count from the session's start: the first stream, then this one
    assert abs(stopped["audio_end_ms"] - len(speech) // 32 - loud_span_ms(speech)[1]) <= 20
    assert wer(SENTENCE, events[-1]["transcript"]) <= MAX_WER


def test_bad_messages_get_error_events_and_the_connection_stays(server, speech):
    audio = base64.b64encode(speech[:CHUNK_BYTES]).decode()
    bad: list[tuple[Any, str, str | None]] = [
        ("{not json", "invalid_json", None),
        ("[1, 2]", "invalid_message", "type"),
        (json.dumps({"type": "response.create"}), "unknown_event", "type"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": audio}), "model_not_set", "session.model"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "%%%="}), "invalid_audio", "audio"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}),
         "invalid_audio", "audio"),
        (json.dumps({"type": "input_audio_buffer.append"}), "invalid_value", "audio"),
        (json.dumps({"type": "session.update", "session": {"model": "Qwen3-0.6B-GGUF"}}), "model_mode_mismatch",
         "session.model"),
        (json.dumps({"type": "session.update", "session": {"model": "No-Such-Model"}}), "model_not_found",
         "session.model"),
        (json.dumps({"type": "session.update", "session": {"turn_detection": {"threshold": "high"}}}),
         "invalid_value", "session.turn_detection.threshold"),
        (json.dumps({"type": "session.update", "session": {"input_audio_transcription": {"language": "english"}}}),
         "invalid_argument", None),
        (b"\x00\x01binary", "invalid_message", None),
    ]

    async def run() -> tuple[list[dict[str, Any]], list[str]]:
        async with session(ws_url(server, path="/v0/realtime")) as ws:
            errors = []
            for message, _, _ in bad:
                await ws.send(message)
                errors.append(await recv(ws))
            # still connected and working: set a model, send speech, get its words
            await send(ws, "session.update", event_id="evt_1", session={"model": WHISPER, "turn_detection": None})
            updated = await recv(ws)
            await stream(ws, speech, pace=0)
            await send(ws, "input_audio_buffer.commit")
            events = await until(ws, f"{TRANSCRIPTION}.completed")
            return errors, [updated["type"], events[-1]["transcript"]]

    errors, (updated, transcript) = asyncio.run(run())
    for (message, code, param), event in zip(bad, errors, strict=True):
        assert event["type"] == "error", (message, event)
        assert event["error"]["code"] == code and event["error"]["message"], (message, event)
        if param is not None:
            assert event["error"]["param"] == param, (message, event)
    assert "'language'" in errors[-2]["error"]["message"]
    assert updated == "session.updated" and wer(SENTENCE, transcript) <= MAX_WER


def test_model_goes_through_the_router(server, speech):
    """Unloaded, the session's model is loaded on demand (at connect) and shows in health as usual."""
    with server.client() as http:
        http.post("/v1/unload", json={})
        assert WHISPER not in loaded(http)

        async def run() -> None:
            async with session(ws_url(server, model=WHISPER)):
                for _ in range(300):
                    if WHISPER in loaded(http):
                        return
                    await asyncio.sleep(0.1)

        asyncio.run(run())
        assert loaded(http)[WHISPER]["type"] == "transcription"


def test_client_leaving_mid_transcription_frees_the_model(server, speech):
    """A session closed while its turn is transcribed: the transcription is dropped, the model is
    released (not left busy) and the next session is served."""
    async def leave() -> None:
        async with session(ws_url(server, model=WHISPER)) as ws:
            await send(ws, "session.update", session={"turn_detection": None})
            await recv(ws)
            await stream(ws, speech * 3, pace=0)
            await send(ws, "input_audio_buffer.commit")
            assert (await recv(ws))["type"] == "input_audio_buffer.committed"
        # closed here, while the 3x longer turn is being transcribed

    asyncio.run(leave())
    with server.client() as http:
        for _ in range(300):
            if not loaded(http)[WHISPER]["is_busy"]:
                break
            time.sleep(0.1)
        assert not loaded(http)[WHISPER]["is_busy"]

    async def again() -> str:
        async with session(ws_url(server, model=WHISPER)) as ws:
            await send(ws, "session.update", session={"turn_detection": None})
            await recv(ws)
            await stream(ws, speech, pace=0)
            await send(ws, "input_audio_buffer.commit")
            return (await until(ws, f"{TRANSCRIPTION}.completed"))[-1]["transcript"]

    assert wer(SENTENCE, asyncio.run(again())) <= MAX_WER
    assert "Traceback" not in server.log()


def rejected(url: str, **kw: Any) -> int:
    """The HTTP status a refused WebSocket handshake got."""
    async def run() -> int:
        try:
            async with connect(url, open_timeout=30, **kw):
                return 101
        except websockets.exceptions.InvalidStatus as exc:
            return exc.response.status_code
    return asyncio.run(run())


def test_key_by_query_or_subprotocol_and_origin_rules(keyed):
    with keyed.client(headers={"Authorization": f"Bearer {KEY}"}) as http:
        ws_port = http.get("/v1/health").json()["websocket_port"]
    assert ws_port != keyed.port
    for port in (keyed.port, ws_port):
        url = ws_url(keyed, path="/realtime", port=port)
        assert rejected(url) == 403  # no key (closed before accept: the handshake answers 403)
        assert rejected(url + "?api_key=wrong") == 403
        assert rejected(url + f"?api_key={KEY}", origin="https://evil.example") == 403

        async def ok(url: str = url) -> str | None:
            async with session(url + f"?api_key={KEY}", origin="http://localhost:3000"):
                pass
            async with session(url, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]) as ws:
                return ws.subprotocol

        assert asyncio.run(ok()) == "realtime"


def test_dedicated_websocket_port(server, speech):
    with server.client() as http:
        ws_port = http.get("/v1/health").json()["websocket_port"]
        assert ws_port != server.port
    not_http = httpx.get(f"http://127.0.0.1:{ws_port}/v1/health")
    assert not_http.status_code == 404 and str(server.port) in not_http.json()["error"]["message"]

    async def run() -> list[dict[str, Any]]:
        async with session(ws_url(server, path="/realtime", port=ws_port, model=WHISPER)) as ws:
            await send(ws, "session.update", session={"turn_detection": None})
            await recv(ws)
            await stream(ws, speech, pace=0)
            await send(ws, "input_audio_buffer.commit")
            return await until(ws, f"{TRANSCRIPTION}.completed")

    assert wer(SENTENCE, asyncio.run(run())[-1]["transcript"]) <= MAX_WER

    async def logs() -> dict[str, Any]:  # the other WebSocket of that port
        async with connect(f"ws://127.0.0.1:{ws_port}/logs/stream") as ws:
            await send(ws, "logs.subscribe", after_seq=None)
            return await recv(ws)

    snapshot = asyncio.run(logs())
    assert snapshot["type"] == "logs.snapshot" and snapshot["entries"]


def test_openai_sdk_realtime_client(server, speech):
    """The official SDK connects to `<base_url>/realtime?model=...` and reads our events."""
    async def run() -> tuple[str, str]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused")
        async with client.realtime.connect(model=WHISPER) as conn:
            created = await conn.recv()
            await conn.send({"type": "session.update", "session": {
                "type": "transcription",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}}}})
            await conn.recv()
            for i in range(0, len(speech), CHUNK_BYTES):
                await conn.input_audio_buffer.append(audio=base64.b64encode(speech[i:i + CHUNK_BYTES]).decode())
            await conn.input_audio_buffer.commit()
            async for event in conn:
                if event.type == f"{TRANSCRIPTION}.completed":
                    return created.type, event.transcript
        raise AssertionError("no transcript")

    created, transcript = asyncio.run(run())
    assert created == "session.created" and wer(SENTENCE, transcript) <= MAX_WER, transcript

