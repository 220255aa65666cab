"""Recipe options per model architecture (Lemonade's `architecture_defaults.json`).

Some model families need settings of their own to answer well, mostly the sampling their authors
recommend (Qwen3's `--temp 0.6 --top-p 0.85 ...`). The shipped file keys them by the GGUF
`general.architecture` of the model file, so every model of a family gets them, built-in or pulled
by the user, without an entry per model. They form one layer of the options chain
(runtime/options.py): under the model's own options, over the server-wide ones.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

RESOURCE = "resources/architecture_defaults.json"


@lru_cache(maxsize=1)
def architecture_defaults() -> dict[str, dict[str, Any]]:
    """Architecture -> recipe options, as shipped (keys starting with `_` are the file's notes)."""
    raw = json.loads(resources.files("lemonade.catalog").joinpath(RESOURCE).read_text(encoding="utf-8"))
    return {arch: dict(opts) for arch, opts in raw.items() if not arch.startswith("_") and isinstance(opts, dict)}


def for_architecture(architecture: str | None) -> dict[str, Any]:
    """The shipped options for one architecture; {} for an unknown or absent one."""
    return dict(architecture_defaults().get(architecture or "", {}))
