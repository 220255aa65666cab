"""Speech worker: one text-to-speech voice model behind a tiny HTTP server.

Run by a TTS engine (backends/piper/engine.py, backends/kokoro/engine.py) with that engine's private venv:
    python speech_worker.py --engine piper|kokoro --model FILE [--config FILE] [--voices PATH]
                            --port N [--threads T]

`--engine` names the module that knows the voice (`tts_piper.py`, `tts_kokoro.py`, next to this
file): it loads the model, lists its voices, maps OpenAI voice names onto them and synthesises
text one sentence at a time. This file is the rest, shared by every TTS engine:

- `GET /health`: 200 once the model is loaded.
- `GET /voices`: `{"voices", "openai_voices", "sample_rate", "formats"}`.
- `POST /speech` with `{"input", "voice", "speed", "response_format", "stream"}`: the audio in that
  format (`audio_encode.py`), or with `"stream": true` 24 kHz PCM16 sent chunk by chunk (HTTP
  chunked encoding), one chunk per sentence as soon as it is synthesised. The first sentence is made
  before the status line is sent, so a text the voice cannot speak is still a 400.

The server validates the request; this worker checks again what only it can know (the voice).
Requests run one at a time: a CPU voice model gains nothing from two syntheses at once.
"""

from __future__ import annotations

import argparse
import importlib
import json
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from audio_encode import CONTENT_TYPES, FORMATS, encode, pcm_chunks
from worker_http import JSONHandler

OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse",
                 "marin", "cedar")
SYNTH: Any = None
LOCK = threading.Lock()


class BadRequest(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def resolve_voice(name: Any) -> str:
    """An engine voice by its own name, or the voice an OpenAI voice name stands for."""
    if name is None or name == "":
        name = "shimmer"
    if not isinstance(name, str):
        raise BadRequest(f"Invalid value for 'voice': expected a string, got {type(name).__name__}", "voice")
    if name in SYNTH.voices:
        return name
    if name.lower() in OPENAI_VOICES:
        return SYNTH.default_for(name.lower(), OPENAI_VOICES)
    some = SYNTH.voices[:12]
    more = f" (and {len(SYNTH.voices) - len(some)} more, GET /voices)" if len(SYNTH.voices) > len(some) else ""
    raise BadRequest(f"Invalid value for 'voice': '{name}' is not a voice of this model. Use one of its voices: "
                     f"{', '.join(some)}{more}; or an OpenAI voice name: {', '.join(OPENAI_VOICES)}", "voice")


def synthesis(body: dict[str, Any]) -> tuple[Iterator[np.ndarray], str]:
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("Invalid value for 'input': the text to speak must be a non-empty string", "input")
    fmt = body.get("response_format") or "wav"
    if fmt not in FORMATS:
        raise BadRequest(f"Invalid value for 'response_format': '{fmt}'. Use one of: {', '.join(FORMATS)}",
                         "response_format")
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or speed <= 0:
        raise BadRequest(f"Invalid value for 'speed': {speed!r} (a positive number)", "speed")
    voice = resolve_voice(body.get("voice"))
    return SYNTH.sentences(text, voice, float(speed)), fmt


def first_and_rest(chunks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    """Make the first chunk now (its failure is the caller's 400), then the rest lazily."""
    try:
        first = next(chunks)
    except StopIteration:
        raise BadRequest("Invalid value for 'input': it holds nothing this voice can speak", "input") from None
    except ValueError as exc:  # the engine refused the text (no phonemes, too long, ...)
        raise BadRequest(f"Invalid value for 'input': {exc}", "input") from None

    def chain() -> Iterator[np.ndarray]:
        yield first
        yield from chunks

    return chain()


class Handler(JSONHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = urlsplit(self.path).path
        if path == "/health":
            self._reply(200 if SYNTH is not None else 503, {"status": "ok" if SYNTH is not None else "loading"})
        elif path == "/voices" and SYNTH is not None:
            self._reply(200, {"voices": SYNTH.voices, "openai_voices": list(OPENAI_VOICES),
                              "sample_rate": SYNTH.sample_rate, "formats": list(FORMATS)})
        else:
            self._reply(404, {"error": {"message": f"Unknown path {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802
        self._sent = False
        self._chunks = 0  # chunks sent (streamed)
        self._made = 0  # chunks synthesised (buffered)
        if urlsplit(self.path).path != "/speech":
            self._reply(404, {"error": {"message": f"Unknown path {self.path}"}})
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        except ValueError as exc:
            self._reply(400, {"error": {"message": f"The request body is not JSON: {exc}", "param": "body"}})
            return
        if not isinstance(body, dict):
            self._reply(400, {"error": {"message": "The request body must be a JSON object", "param": "body"}})
            return
        with LOCK:
            started = time.perf_counter()
            try:
                chunks, fmt = synthesis(body)
                chunks = first_and_rest(chunks)
                if body.get("stream"):
                    self._stream(chunks)
                else:
                    audio = np.concatenate(list(self._while_connected(chunks)))
                    data = encode(audio, SYNTH.sample_rate, fmt)
                    self.send_response(200)
                    self.send_header("Content-Type", CONTENT_TYPES[fmt])
                    self.send_header("Content-Length", str(len(data)))
                    self.send_header("X-Audio-Seconds", f"{len(audio) / SYNTH.sample_rate:.3f}")
                    self.end_headers()
                    self.wfile.write(data)
            except BadRequest as exc:
                self._reply(400, {"error": {"message": str(exc), "param": exc.param}})
                return
            except (BrokenPipeError, ConnectionResetError):
                print(f"client went away after {self._chunks} chunks sent, {self._made} buffered; synthesis "
                      "stopped", flush=True)
                return
            except Exception as exc:  # an engine failure: a 500 if nothing was sent yet, else a cut stream
                print(f"synthesis failed: {type(exc).__name__}: {exc}", flush=True)
                if not self._sent:
                    self._reply(500, {"error": {"message": f"Synthesis failed: {type(exc).__name__}: {exc}"}})
                self.close_connection = True
                return
            print(f"synthesised in {time.perf_counter() - started:.2f}s", flush=True)

    def _while_connected(self, chunks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        """The chunks, stopping early when the caller has hung up (the server closes its connection
        when its client leaves), so an abandoned buffered request does not hold the model."""
        for chunk in chunks:
            self._made += 1
            yield chunk
            readable, _, _ = select.select([self.connection], [], [], 0)
            if readable and not self.connection.recv(1, socket.MSG_PEEK):
                raise BrokenPipeError("the caller closed the connection")

    def _stream(self, chunks: Iterator[np.ndarray]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPES["pcm"])
        self.send_header("Transfer-Encoding", "chunked")
        # Said out loud: a client that would pool this connection after the stream must not reuse it.
        self.send_header("Connection", "close")
        self.end_headers()
        self._sent = True
        for data in pcm_chunks(chunks, SYNTH.sample_rate):
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
            self._chunks += 1
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def main() -> None:
    global SYNTH
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", required=True, choices=("piper", "kokoro"))
    parser.add_argument("--model", required=True)
    parser.add_argument("--config")
    parser.add_argument("--voices")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    # The server stops a worker with SIGTERM. Exiting through SystemExit, not the signal's default,
    # runs the interpreter's finalizers: phonemizer's espeak wrapper (Kokoro's English voices) copies
    # libespeak-ng into a temporary folder that only its finalizer removes, one folder per worker left
    # in /tmp otherwise.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    started = time.perf_counter()
    synth = importlib.import_module(f"tts_{args.engine}").Synth(args.model, args.config, args.voices, args.threads)
    SYNTH = synth
    print(f"{args.engine} voice model loaded from {args.model} in {time.perf_counter() - started:.2f}s "
          f"({len(synth.voices)} voices, {synth.sample_rate} Hz)", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
