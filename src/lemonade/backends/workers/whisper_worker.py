"""faster-whisper worker: one CTranslate2 Whisper model behind a tiny HTTP server.

Run by the faster-whisper engine with the engine's private venv:
    python whisper_worker.py --model DIR --port N [--threads T] [--compute-type int8]

`POST /transcribe?language=&prompt=&temperature=` with the audio file as the body (with a
Content-Length) answers `{"text", "language", "duration", "segments": [{"id", "start", "end",
"text", ...}]}`. The body is written to a temporary file as it arrives and decoded from there by
PyAV (faster-whisper's `decode_audio`: any container FFmpeg reads, resampled to 16 kHz mono), so
a long recording is never held in memory twice. Audio that does not decode is a 400 with code
`invalid_audio`. Shaping the result into json/text/srt/vtt is the server's job, not the worker's.
Transcriptions run one at a time: a CPU Whisper model gains nothing from running two at once.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from worker_http import JSONHandler

MODEL: Any = None
LOCK = threading.Lock()
CHUNK = 1 << 20


class BadRequest(ValueError):
    """The client's mistake, answered with a 400 and this code."""

    code = "invalid_argument"


class BadAudio(BadRequest):
    """The body is not audio PyAV can decode (or holds no samples)."""

    code = "invalid_audio"


def check_language(code: str) -> None:
    """Whisper's language codes; faster-whisper would fail on another one only mid-transcription."""
    from faster_whisper import tokenizer

    known = getattr(tokenizer, "_LANGUAGE_CODES", None)
    if known and code not in known:
        raise BadRequest(f"Invalid value for 'language': '{code}' is not a language Whisper knows "
                         f"(ISO 639-1 codes such as en, de, fr, es, ja)")


def decode(path: str) -> Any:
    """16 kHz mono float32 samples of the audio file at `path`."""
    from faster_whisper.audio import decode_audio

    try:
        samples = decode_audio(path, sampling_rate=16000)
    except Exception as exc:  # PyAV raises its own error classes for every kind of damage
        raise BadAudio(f"Could not decode the audio file: {type(exc).__name__}: {exc}") from None
    if samples.size == 0:
        raise BadAudio("The audio file holds no audio samples")
    return samples


def transcribe(audio: Any, params: dict[str, str]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"beam_size": 1, "vad_filter": False}
    if params.get("language"):
        kwargs["language"] = params["language"]
    if params.get("prompt"):
        kwargs["initial_prompt"] = params["prompt"]
    if params.get("temperature"):
        kwargs["temperature"] = float(params["temperature"])
    started = time.perf_counter()
    with LOCK:
        segments, info = MODEL.transcribe(audio, **kwargs)
        out = [{"id": i, "seek": s.seek, "start": round(s.start, 3), "end": round(s.end, 3), "text": s.text,
                "tokens": list(s.tokens), "temperature": s.temperature, "avg_logprob": s.avg_logprob,
                "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob}
               for i, s in enumerate(segments)]
    return {"text": "".join(s["text"] for s in out).strip(), "language": info.language,
            "duration": info.duration, "segments": out, "processing_seconds": time.perf_counter() - started}


class Handler(JSONHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if urlsplit(self.path).path == "/health":
            self._reply(200 if MODEL is not None else 503, {"status": "ok" if MODEL is not None else "loading"})
        else:
            self._reply(404, {"error": {"message": f"Unknown path {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802
        url = urlsplit(self.path)
        if url.path != "/transcribe":
            self._reply(404, {"error": {"message": f"Unknown path {url.path}"}})
            return
        params = {k: v[0] for k, v in parse_qs(url.query).items()}
        with tempfile.NamedTemporaryFile(prefix="lemonade-audio-", suffix=".bin") as spool:
            self._spool(spool)
            try:
                if params.get("language"):
                    check_language(params["language"])
                samples = decode(spool.name)
            except BadRequest as exc:
                self._reply(400, {"error": {"message": str(exc), "code": exc.code}})
                return
        try:
            self._reply(200, transcribe(samples, params))
        except Exception as exc:  # noqa: BLE001 - reported to the server, which reports it to the client
            self._reply(500, {"error": {"message": f"Transcription failed: {type(exc).__name__}: {exc}"}})

    def _spool(self, out: Any) -> None:
        """The request body, copied to `out` in 1 MB pieces."""
        left = int(self.headers.get("Content-Length") or 0)
        while left > 0:
            piece = self.rfile.read(min(CHUNK, left))
            if not piece:
                break
            out.write(piece)
            left -= len(piece)
        out.flush()


def main() -> None:
    global MODEL
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--compute-type", default="int8")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    from faster_whisper import WhisperModel

    started = time.perf_counter()
    MODEL = WhisperModel(args.model, device="cpu", compute_type=args.compute_type, cpu_threads=args.threads)
    print(f"model loaded from {args.model} in {time.perf_counter() - started:.2f}s", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
