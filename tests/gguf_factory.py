"""Tiny GGUF files written with the `gguf` package, for tests where only metadata matters.

They carry real GGUF headers (architecture, context length, pooling type, split info) so the
catalog's metadata reading is exercised for real, but their weights are a single dummy tensor:
they are never loaded into llama-server. Real inference uses the Gemma package model.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def write_gguf(path: Path, arch: str = "llama", *, context_length: int = 2048, pooling_type: int | None = None,
               clip: bool = False, split: tuple[int, int] | None = None, chat_template: str | None = None,
               meta: dict[str, int | list[int] | list[bool]] | None = None,
               tensors: dict[str, int] | None = None) -> Path:
    """`meta`: more keys, by name without the architecture prefix (`"block_count": 32`,
    `"attention.head_count_kv": [8, 0, ...]`): unsigned integers, or arrays of them or of booleans.
    `tensors`: f32 tensors by name and element count (`"blk.0.ffn_up.weight": 4096`), instead of one dummy."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "clip" if clip else arch)
    writer.add_name(path.stem)
    if clip:
        writer.add_bool("clip.has_vision_encoder", True)
    else:
        writer.add_context_length(context_length)
        if pooling_type is not None:
            writer.add_pooling_type(gguf.PoolingType(pooling_type))
    if chat_template:
        writer.add_chat_template(chat_template)
    for key, value in (meta or {}).items():
        if isinstance(value, list):
            writer.add_array(f"{arch}.{key}", value)
        else:
            writer.add_uint32(f"{arch}.{key}", value)
    if split:
        writer.add_uint16("split.no", split[0] - 1)
        writer.add_uint16("split.count", split[1])
    for name, count in (tensors or {"dummy": 8}).items():
        writer.add_tensor(name, np.zeros(count, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
