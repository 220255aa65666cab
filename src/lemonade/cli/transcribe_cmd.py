"""`lemonade transcribe FILE -m MODEL`: speech to text through the server's `/v1/audio/transcriptions`."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated
from urllib.parse import quote

import typer

from lemonade.cli.client import error_message
from lemonade.cli.common import EXIT_USAGE, HostOpt, PortOpt, fail, require_server, spinner
from lemonade.cli.residency import do_load, load_body
from lemonade.util.lazy import lazy_module

if TYPE_CHECKING:
    import httpx
else:
    httpx = lazy_module("httpx")  # imported on first use (util/lazy.py)


class Format(StrEnum):
    text = "text"
    json = "json"
    verbose_json = "verbose_json"
    srt = "srt"
    vtt = "vtt"


def transcribe(
    file: Annotated[Path, typer.Argument(help="Audio file: wav, mp3, flac, ogg or webm")],
    model: Annotated[str, typer.Option("--model", "-m", help="Transcription model, e.g. Whisper-Tiny-En-CT2")],
    fmt: Annotated[Format, typer.Option("--format", "-f", help="Output: the text, JSON, or subtitles")] = Format.text,
    language: Annotated[str | None, typer.Option("--language", "-l", help="Spoken language (ISO 639-1, e.g. en); "
                                                                          "default: detected")] = None,
    prompt: Annotated[str | None, typer.Option("--prompt", help="Text that sets the style or spells names")] = None,
    temperature: Annotated[float | None, typer.Option("--temperature", min=0, max=1)] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file instead of stdout")] = None,
    host: HostOpt = None, port: PortOpt = None,
) -> None:
    """Transcribe an audio file. The model is loaded first if it is not (with a progress bar: a first
    use may install its engine and download it)."""
    if not file.is_file():
        raise fail(f"{file}: no such file", EXIT_USAGE)
    if file.stat().st_size == 0:
        raise fail(f"{file}: the file is empty", EXIT_USAGE)
    c = require_server(host, port)
    info = c.get(f"/v1/models/{quote(model, safe='')}")  # an unknown model ends here, with the server's message
    loaded = {m.get("model_name") for m in c.get("/v1/health").get("all_models_loaded", [])}
    if "transcription" in (info.get("labels") or []) and info.get("id") not in loaded:
        do_load(c, load_body(model))  # any other model is refused by the transcription request itself
    fields = {"model": model, "response_format": fmt.value}
    for key, value in (("language", language), ("prompt", prompt), ("temperature", temperature)):
        if value is not None:
            fields[key] = str(value)
    with spinner(f"Transcribing {file.name} with {model}"), file.open("rb") as fh:
        try:
            resp = c.http.post("/v1/audio/transcriptions", data=fields, timeout=None,
                               files={"file": (file.name, fh, "application/octet-stream")})
        except httpx.ConnectError:
            raise c.not_running() from None
        except httpx.HTTPError as exc:
            raise fail(f"Request to {c.url} failed: {exc}") from None
    if resp.status_code >= 400:
        raise fail(f"Error {resp.status_code}: {error_message(resp)}")
    text = resp.text if fmt is not Format.text else resp.text.rstrip("\n") + "\n"
    if output is not None:
        output.write_text(text)
        typer.echo(f"Wrote {output}", err=True)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def register(app: typer.Typer) -> None:
    app.command()(transcribe)
