"""`lemonade_generate_image` (mcp.md): the same generation as `/v1/images/generations`, written into
the MCP image sandbox (`output_path`: one exact file; `output_dir`: unique `image_<token>_<i>.png`
names) or returned inline as MCP image blocks. Files are written whole (temp file + rename), so a
failed or cancelled generation leaves nothing half-written."""

from __future__ import annotations

import base64
import os
import tempfile
from pathlib import Path
from typing import Any

from lemonade.api.errors import APIError
from lemonade.api.mcp.sandbox import unique_name
from lemonade.model_info import ModelInfo
from lemonade.services import Services
from lemonade.serving.images import (
    generate_images,
    image_model,
    parse_cfg_scale,
    parse_n,
    parse_seed,
    parse_size,
    parse_steps,
)


class ImageToolError(Exception):
    """Reported to the MCP caller as `isError: true` with this message."""


def pick_image_model(svc: Services, name: str | None) -> ModelInfo:
    """The named model; else the most recently used loaded image model; else a downloaded one."""
    if name:
        model = svc.catalog.find(name)
        if model is None:
            raise ImageToolError(f"Unknown model '{name}'. Call lemonade_list_models to see the models of this "
                                 "server.")
        return model
    loaded = svc.router.models("image")
    if loaded:
        return loaded[0].model
    for model in svc.catalog.all():
        if (model.mode == "image" and "upscaling" not in model.labels and svc.engines.available(model.recipe)
                and svc.catalog.is_downloaded(model)):
            return model
    raise ImageToolError("No image model is loaded or downloaded. Pass `model` (e.g. SD-Turbo; see "
                         "lemonade_list_models); a model that is not downloaded yet is downloaded first.")


def write_png(path: Path, data: bytes) -> Path:
    """`data` at `path`, replacing what was there only once the new file is complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


async def generate(svc: Services, args: dict[str, Any], output_path: Path | None,
                   output_dir: Path | None) -> dict[str, Any]:
    """Run the tool; returns the MCP result (text blocks with paths, or image blocks)."""
    try:
        model, engine = image_model(svc, pick_image_model(svc, args.get("model")).public, "lemonade_generate_image")
        n = parse_n(args.get("n"))
        defaults = model.image_defaults or {}
        size = parse_size(args.get("size"), (int(defaults.get("width", 512)), int(defaults.get("height", 512))))
        answer = await generate_images(svc, model, engine, str(args["prompt"]), size=size, n=n,
                                       steps=parse_steps(args.get("steps")),
                                       cfg_scale=parse_cfg_scale(args.get("cfg_scale")),
                                       seed=parse_seed(args.get("seed")))
    except APIError as exc:
        raise ImageToolError(exc.message) from None
    pngs = [base64.b64decode(item["b64_json"]) for item in answer["data"]]
    if output_path is None and output_dir is None:
        return {"content": [{"type": "image", "data": base64.b64encode(p).decode(), "mimeType": "image/png"}
                            for p in pngs], "isError": False}
    if output_path is not None:
        paths = [write_png(output_path, pngs[0])]
    else:
        assert output_dir is not None
        paths = [write_png(output_dir / unique_name("image", i, ".png"), p) for i, p in enumerate(pngs)]
    blocks = [{"type": "text", "text": str(p)} for p in paths]
    return {"content": blocks, "isError": False, "structuredContent": {"paths": [str(p) for p in paths]}}
