"""`lemonade speak "text" -m MODEL -o out.wav`: text to speech through the server's `/v1/audio/speech`.

A model that is not loaded yet is loaded first with a progress bar (a first use may install the
engine and download the voice). The audio is written to a temporary file next to the target and
renamed into place only once complete, so a failure never leaves half a file behind.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from lemonade.cli.client import error_message
from lemonade.cli.common import EXIT_USAGE, HostOpt, PortOpt, fail, out, require_server
from lemonade.cli.residency import do_load, load_body
from lemonade.util.lazy import lazy_module

if TYPE_CHECKING:
    import httpx
else:
    httpx = lazy_module("httpx")  # imported on first use (util/lazy.py)

FORMAT_BY_SUFFIX = {".wav": "wav", ".mp3": "mp3", ".opus": "opus", ".ogg": "opus", ".aac": "aac", ".flac": "flac",
                    ".pcm": "pcm", ".raw": "pcm"}


def _format_for(output: str, given: str | None) -> str:
    if given:
        return given
    return FORMAT_BY_SUFFIX.get(Path(output).suffix.lower(), "wav") if output != "-" else "wav"


def _write_atomically(target: Path, chunks: Any) -> int:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    size = 0
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
                size += len(chunk)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return size


def speak(
    text: Annotated[str, typer.Argument(help="The text to speak; '-' reads it from standard input")],
    model: Annotated[str, typer.Option("--model", "-m", help="A text-to-speech model, e.g. kokoro-v1 or "
                                                             "piper-en-us-lessac-medium")],
    output: Annotated[str, typer.Option("--output", "-o", help="Audio file to write ('-': standard output)")]
    = "speech.wav",
    voice: Annotated[str | None, typer.Option("--voice", help="An OpenAI voice name (alloy, echo, ...) or one "
                                                             "of the model's voices")] = None,
    speed: Annotated[float | None, typer.Option("--speed", help="Speaking speed, 1.0 is normal")] = None,
    fmt: Annotated[str | None, typer.Option("--format", help="mp3, opus, aac, flac, wav or pcm (default: from "
                                                            "the output file's extension, else wav)")] = None,
    host: HostOpt = None, port: PortOpt = None,
) -> None:
    """Turn text into speech with a TTS model and write the audio to a file."""
    if text == "-":
        text = sys.stdin.read()
    if not text.strip():
        raise fail("Nothing to speak: the text is empty.", EXIT_USAGE)
    c = require_server(host, port)
    loaded = {m.get("model_name") for m in (c.get("/v1/health") or {}).get("all_models_loaded", [])}
    if model not in loaded:
        do_load(c, load_body(model))
    body: dict[str, Any] = {"model": model, "input": text, "response_format": _format_for(output, fmt)}
    if voice is not None:
        body["voice"] = voice
    if speed is not None:
        body["speed"] = speed
    try:
        with c.http.stream("POST", "/v1/audio/speech", json=body, timeout=None) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise fail(f"Error {resp.status_code}: {error_message(resp)}")
            if output == "-":
                for chunk in resp.iter_bytes():
                    sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
                return
            size = _write_atomically(Path(output), resp.iter_bytes())
    except httpx.ConnectError:
        raise c.not_running() from None
    except httpx.HTTPError as exc:
        raise fail(f"The speech request failed: {exc}") from None
    out.print(f"Wrote {escape(output)} ({size / 1024:.0f} KB, {body['response_format']})", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("speak")(speak)
