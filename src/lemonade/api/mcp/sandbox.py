"""The MCP output sandbox: where `output_path` / `output_dir` of the image tools may write.

MCP callers can be other programs (or, through a browser, other origins), so a tool must never be
a way to overwrite arbitrary files such as `~/.bashrc`. Every output path is resolved (symlinks
included) and must stay inside the sandbox root: `<cache dir>/mcp-images`, or the absolute path in
`LEMONADE_MCP_IMAGE_DIR`. Relative paths are taken relative to the root.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

ENV_VAR = "LEMONADE_MCP_IMAGE_DIR"


class SandboxError(ValueError):
    """A path that would leave the sandbox, or an unusable sandbox; the message says which."""


def sandbox_root(cache_dir: Path) -> Path:
    """The (created, fully resolved) sandbox root."""
    override = os.environ.get(ENV_VAR, "").strip()
    if override:
        root = Path(override)
        if not root.is_absolute():
            raise SandboxError(f"{ENV_VAR} must be an absolute path, got {override!r}")
    else:
        root = Path(cache_dir) / "mcp-images"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SandboxError(f"Cannot create the MCP image sandbox {root}: {exc}") from None
    return root.resolve()


def confine(raw: str, root: Path, label: str, *, allow_root: bool = False) -> Path:
    """`raw` resolved inside `root`, or SandboxError naming the argument.

    Resolution follows symlinks in every existing component, so a link inside the sandbox that
    points outside it is caught, as is any `..` that climbs out.
    """
    if not isinstance(raw, str) or not raw.strip():
        raise SandboxError(f"`{label}` must not be empty")
    if "\x00" in raw:
        raise SandboxError(f"`{label}` must not contain NUL characters")
    requested = Path(raw)
    combined = requested if requested.is_absolute() else root / requested
    resolved = combined.resolve(strict=False)
    inside = resolved == root or root in resolved.parents
    if not inside or (resolved == root and not allow_root):
        raise SandboxError(f"`{label}` must resolve to a location inside the MCP image sandbox ({root}); "
                           f"set {ENV_VAR} to move the sandbox. Rejected: {raw}")
    return resolved


def unique_name(prefix: str, index: int, suffix: str) -> str:
    """A file name no concurrent caller will pick: millisecond clock plus random bits."""
    return f"{prefix}_{int(time.time() * 1000):x}-{uuid.uuid4().hex[:8]}_{index}{suffix}"
