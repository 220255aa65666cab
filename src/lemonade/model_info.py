"""The catalog's record of one model, whatever it came from (built-in list, user, extra dir)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lemonade.labels import model_type

CREATED = 1744173590  # the timestamp Lemonade reports for catalog entries
# Checkpoint roles a pull does not fetch: an NPU backend's side cache (Whisper's `npu_cache`) is
# fetched by that backend itself when it loads, as upstream Lemonade does; CPU and GPU machines never
# need it, so it is neither downloaded nor required for a model to count as downloaded.
SIDE_ROLES = frozenset({"npu_cache"})


@dataclass
class ModelInfo:
    name: str                                  # canonical id: "builtin.Qwen3-0.6B-GGUF", "user.X", "extra.Y"
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
    # The id clients see (catalog/naming.py): the bare name when this model wins it, else `name`.
    # Kept current by the catalog; internal state (loaded models, options, downloads) uses `name`.
    public: str = ""
    hidden_names: list[str] = field(default_factory=list)  # extra input names, never listed

    def __post_init__(self) -> None:
        if not self.public:
            self.public = self.name

    @property
    def bare(self) -> str:
        """The name without its source prefix."""
        return self.name.split(".", 1)[1] if self.name.startswith(("user.", "extra.", "builtin.")) else self.name

    @property
    def checkpoint(self) -> str:
        return self.checkpoints.get("main", "")

    @property
    def metadata_only(self) -> bool:
        """A user definition registered without a checkpoint (`POST /v1/models/register`): listed, but
        there is nothing to download or load until it is registered with one. (A cloud model has no
        checkpoint either, and needs none.)"""
        return self.origin == "user" and not self.is_collection and not self.checkpoint

    @property
    def file_checkpoints(self) -> dict[str, str]:
        """role -> checkpoint of the files a pull fetches (every role but SIDE_ROLES)."""
        return {role: ckpt for role, ckpt in self.checkpoints.items() if role not in SIDE_ROLES}

    @property
    def type(self) -> str:
        """Residency type: llm, embedding, reranking, transcription, image, tts."""
        return model_type(self.mode)

    @property
    def is_collection(self) -> bool:
        return self.recipe.startswith("collection.")
