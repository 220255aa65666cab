"""faster-whisper worker: one CTranslate2 Whisper model behind a tiny HTTP server.

Run by the faster-whisper engine with the engine's private venv:
    python whisper_worker.py --model DIR --port N [--threads T] [--compute-type int8]

`POST /transcribe?language=&prompt=&temperature=` with the audio file as the body (any format
PyAV decodes; faster-whisper resamples to 16 kHz) answers
`{"text", "language", "duration", "segments": [{"id", "start", "end", "text", ...}]}`.
Shaping that into json/text/srt/vtt is the server's job, not the worker's. Requests are served
one at a time: a CPU Whisper model gains nothing from running two transcriptions at once.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

MODEL: Any = None
LOCK = threading.Lock()


def transcribe(audio: bytes, params: dict[str, str]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"beam_size": 1, "vad_filter": False}
    if params.get("language"):
        kwargs["language"] = params["language"]
    if params.get("prompt"):
        kwargs["initial_prompt"] = params["prompt"]
    if params.get("temperature"):
        kwargs["temperature"] = float(params["temperature"])
    started = time.perf_counter()
    with LOCK:
        segments, info = MODEL.transcribe(io.BytesIO(audio), **kwargs)
        out = [{"id": i, "seek": s.seek, "start": round(s.start, 3), "end": round(s.end, 3), "text": s.text,
                "tokens": list(s.tokens), "temperature": s.temperature, "avg_logprob": s.avg_logprob,
                "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob}
               for i, s in enumerate(segments)]
    return {"text": "".join(s["text"] for s in out).strip(), "language": info.language,
            "duration": info.duration, "segments": out, "processing_seconds": time.perf_counter() - started}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:  # one line per request, to our stdout
        sys.stdout.write(f"{self.command} {fmt % args}\n")
        sys.stdout.flush()

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

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
        length = int(self.headers.get("Content-Length") or 0)
        audio = self.rfile.read(length)
        params = {k: v[0] for k, v in parse_qs(url.query).items()}
        try:
            self._reply(200, transcribe(audio, params))
        except Exception as exc:  # undecodable audio and the like: the caller's problem, said plainly
            self._reply(400, {"error": {"message": f"Could not transcribe the audio: {type(exc).__name__}: {exc}"}})


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
