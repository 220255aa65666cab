"""Read the key/value header of a GGUF file without touching its tensors.

Listing needs a handful of facts per file (architecture, trained context length, pooling type,
whether a chat template is embedded). Reading them with a small streaming parser costs a few
milliseconds even for multi-GB files; results are memoised on (path, size, mtime).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import IO, Any

GGUF_MAGIC = b"GGUF"
# GGUF value types
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# llama.cpp's enum llama_pooling_type
POOLING_RANK = 4
ENCODER_ARCHITECTURES = {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "modern-bert",
                         "neo-bert", "t5encoder", "eurobert"}


class GGUFError(ValueError):
    pass


@dataclass(frozen=True)
class GGUFInfo:
    architecture: str
    name: str
    context_length: int | None
    pooling_type: int | None
    has_chat_template: bool
    is_mmproj: bool
    split_count: int

    @property
    def deployment_mode(self) -> str:
        """chat, embeddings or reranking, as llama-server would have to be started for it."""
        if self.pooling_type == POOLING_RANK:
            return "reranking"
        if self.architecture in ENCODER_ARCHITECTURES or (self.pooling_type or 0) > 0:
            return "embeddings"
        return "chat"


def _read(fh: IO[bytes], fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = fh.read(size)
    if len(data) != size:
        raise GGUFError("truncated GGUF header")
    return struct.unpack(fmt, data)[0]


def _read_str(fh: IO[bytes]) -> str:
    length = _read(fh, "<Q")
    if length > 1 << 28:
        raise GGUFError("implausible string length in GGUF header")
    data = fh.read(length)
    if len(data) != length:
        raise GGUFError("truncated GGUF header")
    return data.decode("utf-8", errors="replace")


def _skip_value(fh: IO[bytes], vtype: int) -> None:
    if vtype in _SCALARS:
        fh.seek(struct.calcsize(_SCALARS[vtype]), 1)
    elif vtype == _STRING:
        fh.seek(_read(fh, "<Q"), 1)
    elif vtype == _ARRAY:
        item_type = _read(fh, "<I")
        count = _read(fh, "<Q")
        if item_type in _SCALARS:
            fh.seek(struct.calcsize(_SCALARS[item_type]) * count, 1)
        else:
            for _ in range(count):
                _skip_value(fh, item_type)
    else:
        raise GGUFError(f"unknown GGUF value type {vtype}")


MAX_ARRAY_ITEMS = 1 << 16  # per-layer arrays have a few hundred items; a vocabulary has far more


def read_metadata(path: Path, wanted: set[str] | None = None, arrays: bool = False) -> dict[str, Any]:
    """All scalar/string metadata, or only the `wanted` keys when given. Arrays are skipped unless
    `arrays`: then arrays of numbers or booleans (per-layer head counts, sliding-window patterns) of
    at most MAX_ARRAY_ITEMS items are read as lists."""
    out: dict[str, Any] = {}
    with open(path, "rb", buffering=1 << 16) as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise GGUFError(f"{path} is not a GGUF file")
        version = _read(fh, "<I")
        if version < 2:
            raise GGUFError(f"{path}: GGUF version {version} is not supported")
        _read(fh, "<Q")  # tensor count
        kv_count = _read(fh, "<Q")
        for _ in range(kv_count):
            key = _read_str(fh)
            vtype = _read(fh, "<I")
            if wanted is not None and key not in wanted and not key.endswith(tuple(wanted)):
                _skip_value(fh, vtype)
            elif vtype in _SCALARS:
                out[key] = _read(fh, _SCALARS[vtype])
            elif vtype == _STRING:
                out[key] = _read_str(fh)
            elif arrays and vtype == _ARRAY:
                value = _read_scalar_array(fh)
                if value is not None:
                    out[key] = value
            else:
                _skip_value(fh, vtype)
    return out


def _read_scalar_array(fh: IO[bytes]) -> list[Any] | None:
    """An array of scalars as a list; any other array is skipped (None)."""
    item_type = _read(fh, "<I")
    count = _read(fh, "<Q")
    if item_type not in _SCALARS or count > MAX_ARRAY_ITEMS:
        if item_type in _SCALARS:
            fh.seek(struct.calcsize(_SCALARS[item_type]) * count, 1)
        else:
            for _ in range(count):
                _skip_value(fh, item_type)
        return None
    fmt = "<" + _SCALARS[item_type].lstrip("<") * count
    data = fh.read(struct.calcsize(fmt))
    if len(data) != struct.calcsize(fmt):
        raise GGUFError("truncated GGUF header")
    return list(struct.unpack(fmt, data))


@lru_cache(maxsize=512)
def _info_cached(path: str, size: int, mtime: float) -> GGUFInfo:
    meta = read_metadata(Path(path))
    arch = str(meta.get("general.architecture", ""))
    ctx = meta.get(f"{arch}.context_length")
    pooling = meta.get(f"{arch}.pooling_type")
    return GGUFInfo(
        architecture=arch,
        name=str(meta.get("general.name", "")),
        context_length=int(ctx) if isinstance(ctx, int) else None,
        pooling_type=int(pooling) if isinstance(pooling, int) else None,
        has_chat_template="tokenizer.chat_template" in meta,
        is_mmproj=arch == "clip" or "clip.has_vision_encoder" in meta,
        split_count=int(meta.get("split.count", 1) or 1),
    )


def gguf_info(path: Path) -> GGUFInfo:
    st = Path(path).stat()
    return _info_cached(str(Path(path).resolve()), st.st_size, st.st_mtime)
