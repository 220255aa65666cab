"""Where Lemonade keeps its state on disk.

Everything that must survive a restart lives under one cache dir so that a user (or a test) can
move or wipe it as a unit. `LEMONADE_CACHE_DIR` overrides the default `~/.cache/lemonade`.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The Lemonade cache dir, created on first use."""
    raw = os.environ.get("LEMONADE_CACHE_DIR") or os.path.join(Path.home(), ".cache", "lemonade")
    path = Path(raw).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def backends_dir(cache: Path | None = None) -> Path:
    """Installed engine binaries: `<cache>/backends/<recipe>/<backend>/`."""
    return (cache or cache_dir()) / "backends"
