"""How our catalog entries look to Ollama clients: `/api/tags`, `/api/show` and `/api/ps` entries.

Ollama describes models by GGUF facts (family, parameter size, quantization), so these are read
from the GGUF header when the file is on disk and inferred from names otherwise. Names are listed
with Ollama's `:latest` tag, as Ollama lists them; every API resolves `MODEL:latest` to MODEL, so
a name copied from `/api/tags` into an OpenAI-compatible call still finds the model.
"""

from __future__ import annotations

import hashlib
import logging
import re
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from lemonade.api.errors import APIError
from lemonade.backends.llamacpp.engine import fallback_template
from lemonade.catalog.catalog import DEFAULT_TAG
from lemonade.catalog.gguf_meta import GGUFError, read_metadata
from lemonade.model_info import CREATED, ModelInfo
from lemonade.recipes import file_format
from lemonade.services import Services
from lemonade.serving.models import component_names, context_length, shown_checkpoint

log = logging.getLogger("lemonade.ollama")

# llama.cpp's enum llama_ftype, for `general.file_type`.
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
              18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
              25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
              32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4"}
QUANT_RE = re.compile(r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|F16|F32|BF16|MXFP4)(?![A-Za-z0-9])", re.IGNORECASE)
SIZE_RE = re.compile(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)([BbMm])(?![A-Za-z])")
FAR_FUTURE = "2318-01-01T00:00:00Z"  # Ollama's expires_at for a model kept loaded indefinitely


def tagged(model: ModelInfo) -> str:
    """The name as Ollama lists it: with its default tag."""
    return model.public + DEFAULT_TAG


def resolve(svc: Services, name: str) -> ModelInfo:
    """A model by the name an Ollama client sends (`name` or `name:latest`), or one a peer of the LAN
    serves, or Ollama's 404."""
    model = svc.catalog.find(name) or svc.forwarding.elsewhere(name)
    if model is None:
        raise APIError(404, f"model '{name}' not found, try pulling it first. Run `lemonade list` to see "
                       "available models.", type="not_found", code="model_not_found")
    return model


@lru_cache(maxsize=256)
def _metadata_cached(path: str, size: int, mtime: float) -> dict[str, Any]:
    return read_metadata(Path(path))


def gguf_metadata(files: dict[str, list[Path]] | None) -> dict[str, Any]:
    """The main GGUF's scalar header values (a fresh copy; memoised on path, size and mtime)."""
    if not files or not files.get("main"):
        return {}
    main = files["main"][0]
    if main.suffix.lower() != ".gguf":
        return {}
    try:
        st = main.stat()
        return dict(_metadata_cached(str(main.resolve()), st.st_size, st.st_mtime))
    except (OSError, GGUFError) as exc:
        log.debug("Cannot read GGUF metadata of %s: %s", main, exc)
        return {}


def _size_bytes(model: ModelInfo, files: dict[str, list[Path]] | None) -> int:
    if files:
        total = 0
        for paths in files.values():
            for path in paths:
                try:
                    total += path.stat().st_size
                except OSError:
                    pass
        if total:
            return total
    return int((model.size or 0) * (1 << 30))


def _modified_at(files: dict[str, list[Path]] | None) -> str:
    stamp = 0.0
    for paths in (files or {}).values():
        for path in paths:
            try:
                stamp = max(stamp, path.stat().st_mtime)
            except OSError:
                pass
    when = datetime.fromtimestamp(stamp or CREATED, UTC)
    return when.isoformat().replace("+00:00", "Z")


def _digest(model: ModelInfo, files: dict[str, list[Path]] | None) -> str:
    """A stable 64-hex identity: the name, checkpoint and the files' sizes."""
    h = hashlib.sha256(f"{model.public}\0{model.checkpoint}".encode())
    for role in sorted(files or {}):
        for path in (files or {})[role]:
            try:
                h.update(f"\0{path.name}\0{path.stat().st_size}".encode())
            except OSError:
                pass
    return h.hexdigest()


def _quantization(meta: dict[str, Any], model: ModelInfo, files: dict[str, list[Path]] | None) -> str:
    ftype = meta.get("general.file_type")
    if isinstance(ftype, int) and ftype in FILE_TYPES:
        return FILE_TYPES[ftype]
    candidates = [model.checkpoint.partition(":")[2]]
    candidates += [p.name for p in (files or {}).get("main", [])]
    for text in candidates:
        found = QUANT_RE.findall(text or "")
        if found:
            return found[-1].upper()
    return ""


def _parameter_size(meta: dict[str, Any], model: ModelInfo) -> str:
    label = meta.get("general.size_label")
    if isinstance(label, str) and label:
        return label.upper()
    count = meta.get("general.parameter_count")
    if isinstance(count, int) and count > 0:
        return f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.0f}M"
    found = SIZE_RE.findall(model.bare)
    return f"{found[-1][0]}{found[-1][1].upper()}" if found else ""


def details(model: ModelInfo, files: dict[str, list[Path]] | None,
            meta: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = gguf_metadata(files) if meta is None else meta
    # the file's architecture; before a download, the catalog's (llama.cpp entries name theirs)
    family = str(meta.get("general.architecture") or model.definition.get("architecture") or model.recipe)
    return {"parent_model": "", "format": file_format(model.recipe) or model.recipe,
            "family": family, "families": [family], "parameter_size": _parameter_size(meta, model),
            "quantization_level": _quantization(meta, model, files)}


def collection_files(svc: Services, model: ModelInfo) -> dict[str, list[Path]]:
    """The files of a collection's components, by component and role (its size, digest and date)."""
    out: dict[str, list[Path]] = {}
    for name in component_names(svc, model):
        comp = svc.catalog.find(name)
        for role, paths in ((svc.catalog.local_files(comp) if comp is not None else None) or {}).items():
            out[f"{name}:{role}"] = list(paths)
    return out


def tags_entry(svc: Services, model: ModelInfo, files: dict[str, list[Path]] | None) -> dict[str, Any]:
    return {"name": tagged(model), "model": tagged(model), "modified_at": _modified_at(files),
            "size": _size_bytes(model, files), "digest": _digest(model, files), "details": details(model, files)}


def capabilities(model: ModelInfo, template: str | None) -> list[str]:
    caps: list[str] = []
    if model.mode == "chat":
        caps.append("completion")
    elif model.mode == "embeddings":
        caps.append("embedding")
    if model.mode == "chat" and ("tool-calling" in model.labels or "tools" in model.labels
                                 or (template is not None and "tool" in template)):
        caps.append("tools")
    if "vision" in model.labels:
        caps.append("vision")
    if "reasoning" in model.labels:
        caps.append("thinking")
    return caps


def _fallback_template(meta: dict[str, Any]) -> str | None:
    """The template llama-server is given for a GGUF that carries none (what the model really sees)."""
    try:
        return fallback_template(str(meta.get("general.architecture", ""))).read_text()
    except OSError:
        return None


def show(svc: Services, model: ModelInfo, verbose: bool = False) -> dict[str, Any]:
    files = svc.catalog.local_files(model) if not model.is_collection else None
    meta = gguf_metadata(files)
    template = meta.pop("tokenizer.chat_template", None)
    if template is None and meta and model.mode == "chat":
        template = _fallback_template(meta)
    ctx = context_length(svc, model, files=files)
    model_info = {k: v for k, v in meta.items() if verbose or not k.startswith("tokenizer.")}
    model_info.setdefault("general.architecture", details(model, files, meta)["family"])
    if ctx:  # the context the model runs with (Lemonade's key; the GGUF's own `<arch>.context_length` is its limit)
        model_info[f"{model.recipe}.context_length"] = ctx
    source = shown_checkpoint(model)  # Ollama names its blob path here; ours would name the user's folders
    params = f"num_ctx {ctx}" if ctx else ""
    modelfile = f"# Modelfile generated by Lemonade\nFROM {source}\n" + (f"PARAMETER {params}\n" if params else "")
    return {
        "license": str(meta.get("general.license", "")),
        "modelfile": modelfile,
        "parameters": params,
        "template": template or "",
        "details": details(model, files, meta),
        "model_info": model_info,
        "capabilities": capabilities(model, template),
        "modified_at": _modified_at(files),
    }


def ps_entry(svc: Services, loaded: dict[str, Any]) -> dict[str, Any] | None:
    model = svc.catalog.find(loaded["model_name"])
    if model is None:
        return None
    files = svc.catalog.local_files(model)
    ctx = context_length(svc, model, files=files)
    size = _size_bytes(model, files)
    # Ollama's share of the model held in GPU memory: a GPU backend offloads every layer (-ngl 99).
    entry = {"name": tagged(model), "model": tagged(model), "size": size,
             "digest": _digest(model, files), "details": details(model, files), "expires_at": FAR_FUTURE,
             "size_vram": size if loaded.get("device") == "gpu" else 0}
    if ctx is not None:
        entry["context_length"] = ctx
    return entry


async def unload(svc: Services, model: ModelInfo) -> None:
    """Stop the model's engine (a collection's components), if it is loaded."""
    names = component_names(svc, model) if model.is_collection else [model.name]
    for name in names:
        await svc.router.unload(name)
