"""The catalog's record of one model, whatever it came from (built-in list, user, extra dir)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lemonade.labels import model_type

CREATED = 1744173590  # the timestamp Lemonade reports for catalog entries


@dataclass
class ModelInfo:
    name: str                                  # public id: "Qwen3-0.6B-GGUF", "user.X", "extra.Y"
    recipe: str
    mode: str                                  # deployment mode: chat, embeddings, reranking, ...
    checkpoints: dict[str, str] = field(default_factory=dict)   # role -> "owner/repo:variant"
    labels: list[str] = field(default_factory=list)
    size: float | None = None                  # GB
    suggested: bool = False
    source: str = "huggingface"                # huggingface | modelscope | local
    origin: str = "builtin"                    # builtin | user | extra
    image_defaults: dict[str, Any] | None = None
    components: list[str] | None = None        # collection.omni
    local_files: dict[str, list[Path]] | None = None  # extra models: role -> files on disk
    created: int = CREATED
    definition: dict[str, Any] = field(default_factory=dict)  # the stored definition, for export

    @property
    def checkpoint(self) -> str:
        return self.checkpoints.get("main", "")

    @property
    def type(self) -> str:
        """Residency type: llm, embedding, reranking, transcription, image, tts."""
        return model_type(self.mode)

    @property
    def is_collection(self) -> bool:
        return self.recipe.startswith("collection.")
