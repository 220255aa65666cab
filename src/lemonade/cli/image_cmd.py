"""`lemonade generate "prompt" -m MODEL -o out.png` and `lemonade upscale in.png -m MODEL`: pictures
through the server's `/v1/images/generations` and `/v1/images/upscale`.

A generation model that is not loaded yet is loaded first with a progress bar (a first use may
build the engine and download the weights); an upscaling model runs per request, downloaded by
the server on first use. Files are written whole (temp file + rename): a failure never leaves half
a PNG behind.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from lemonade.cli.client import error_message
from lemonade.cli.common import EXIT_USAGE, HostOpt, PortOpt, fail, out, require_server
from lemonade.cli.residency import do_load, load_body
from lemonade.cli.speech_cmd import _write_atomically
from lemonade.util.lazy import lazy_module

if TYPE_CHECKING:
    import httpx
else:
    httpx = lazy_module("httpx")  # imported on first use (util/lazy.py)


def _post(c: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    try:
        resp = c.http.post(path, json=body, timeout=None)
    except httpx.ConnectError:
        raise c.not_running() from None
    except httpx.HTTPError as exc:
        raise fail(f"The request to {path} failed: {exc}") from None
    if resp.status_code >= 400:
        raise fail(f"Error {resp.status_code}: {error_message(resp)}")
    return resp.json()


def _save(output: Path, answer: dict[str, Any]) -> list[Path]:
    """Each image of `answer`: `output` for the first, `<stem>-<i><suffix>` for the others."""
    paths = []
    for i, item in enumerate(answer.get("data") or []):
        target = output if i == 0 else output.with_name(f"{output.stem}-{i}{output.suffix}")
        _write_atomically(target, [base64.b64decode(item["b64_json"])])
        paths.append(target)
    return paths


def generate(
    prompt: Annotated[str, typer.Argument(help="What the picture shows")],
    model: Annotated[str, typer.Option("--model", "-m", help="An image model, e.g. SD-Turbo")],
    output: Annotated[Path, typer.Option("--output", "-o", help="PNG file to write")] = Path("image.png"),
    size: Annotated[str | None, typer.Option("--size", help="WIDTHxHEIGHT, multiples of 64 (default: the "
                                                           "model's, else 512x512)")] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="Sampling steps (default: the model's)")] = None,
    cfg_scale: Annotated[float | None, typer.Option("--cfg-scale", help="Guidance scale")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Same seed, same picture (default: random)")] = None,
    n: Annotated[int, typer.Option("-n", help="Number of pictures (out.png, out-1.png, ...)")] = 1,
    host: HostOpt = None, port: PortOpt = None,
) -> None:
    """Generate a picture from a prompt with an image model and write it as PNG."""
    if not prompt.strip():
        raise fail("Nothing to draw: the prompt is empty.", EXIT_USAGE)
    c = require_server(host, port)
    loaded = {m.get("model_name") for m in (c.get("/v1/health") or {}).get("all_models_loaded", [])}
    if model not in loaded:
        do_load(c, load_body(model))
    body: dict[str, Any] = {"model": model, "prompt": prompt, "n": n, "response_format": "b64_json"}
    for key, value in (("size", size), ("steps", steps), ("cfg_scale", cfg_scale), ("seed", seed)):
        if value is not None:
            body[key] = value
    started = time.monotonic()
    paths = _save(output, _post(c, "/v1/images/generations", body))
    for path in paths:
        out.print(f"Wrote {escape(str(path))} ({path.stat().st_size / 1024:.0f} KB) in "
                  f"{time.monotonic() - started:.1f} s", highlight=False)


def upscale(
    image: Annotated[Path, typer.Argument(help="The PNG to upscale")],
    model: Annotated[str, typer.Option("--model", "-m", help="A Real-ESRGAN model, e.g. RealESRGAN-x4plus")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="PNG to write (default: "
                                                                      "<name>-upscaled.png)")] = None,
    host: HostOpt = None, port: PortOpt = None,
) -> None:
    """Upscale a picture 4x with a Real-ESRGAN model and write it as PNG."""
    try:
        data = image.read_bytes()
    except OSError as exc:
        raise fail(f"Cannot read {image}: {exc.strerror or exc}", EXIT_USAGE) from None
    c = require_server(host, port)
    target = output or image.with_name(f"{image.stem}-upscaled.png")
    started = time.monotonic()
    paths = _save(target, _post(c, "/v1/images/upscale", {"model": model, "image": base64.b64encode(data).decode()}))
    out.print(f"Wrote {escape(str(paths[0]))} ({paths[0].stat().st_size / 1024:.0f} KB) in "
              f"{time.monotonic() - started:.1f} s", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("generate")(generate)
    app.command("upscale")(upscale)
