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


# ----- tensors: what a load will hold resident ---------------------------------------------------------
# ggml's type ids (ggml.h `enum ggml_type`), for the ones whose name a rule needs
GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
              11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS",
              18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8",
              25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0",
              39: "MXFP4"}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    type: str  # ggml's name for it ("Q4_K"), or "type<id>" for one not listed above
    dims: tuple[int, ...]
    nbytes: int  # its data in the file


@dataclass(frozen=True)
class GGUFLayout:
    """What a memory estimate reads of a GGUF: its metadata (arrays of numbers included), the lengths
    of the arrays it skipped (the vocabulary's size), and its tensors."""

    meta: dict[str, Any]
    array_lengths: dict[str, int]
    tensors: tuple[GGUFTensor, ...]
    file_bytes: int


def _read_layout(path: Path) -> GGUFLayout:
    meta: dict[str, Any] = {}
    lengths: dict[str, int] = {}
    size = path.stat().st_size
    with open(path, "rb", buffering=1 << 16) as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise GGUFError(f"{path} is not a GGUF file")
        if _read(fh, "<I") < 2:
            raise GGUFError(f"{path}: GGUF version is not supported")
        n_tensors = _read(fh, "<Q")
        for _ in range(_read(fh, "<Q")):
            key = _read_str(fh)
            vtype = _read(fh, "<I")
            if vtype in _SCALARS:
                meta[key] = _read(fh, _SCALARS[vtype])
            elif vtype == _STRING:
                meta[key] = _read_str(fh)
            elif vtype == _ARRAY:
                start = fh.tell()
                fh.seek(4, 1)
                lengths[key] = _read(fh, "<Q")
                fh.seek(start)
                value = _read_scalar_array(fh)
                if value is not None:
                    meta[key] = value
            else:
                _skip_value(fh, vtype)
        raw = []
        for _ in range(n_tensors):
            name = _read_str(fh)
            n_dims = _read(fh, "<I")
            dims = tuple(_read(fh, "<Q") for _ in range(n_dims))
            type_id = _read(fh, "<I")
            raw.append((name, GGML_TYPES.get(type_id, f"type{type_id}"), dims, _read(fh, "<Q")))
        align = int(meta.get("general.alignment", 32) or 32)
        data_start = -(-fh.tell() // align) * align
    ends = sorted({offset for *_, offset in raw} | {size - data_start})
    nxt = {offset: ends[i + 1] for i, offset in enumerate(ends[:-1])}
    tensors = tuple(GGUFTensor(name, kind, dims, max(0, nxt.get(offset, offset) - offset))
                    for name, kind, dims, offset in raw)
    return GGUFLayout(meta, lengths, tensors, size)


@lru_cache(maxsize=64)
def _layout_cached(path: str, size: int, mtime: float) -> GGUFLayout:
    return _read_layout(Path(path))


def gguf_layout(path: Path) -> GGUFLayout:
    """The metadata and tensors of a GGUF file (memoised on path, size and mtime)."""
    st = Path(path).stat()
    return _layout_cached(str(Path(path).resolve()), st.st_size, st.st_mtime)
