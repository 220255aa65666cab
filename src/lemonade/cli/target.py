"""Where the CLI's server is and which key it uses, as the root command's options say.

Kept apart from the HTTP client (client.py) so that the root command, which every command runs
(`serve` included), imports neither rich nor httpx to record them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class Target:
    """Where the server is, as the global options said (`lemonade --host H --port P CMD`, or the same
    options after the command); a command's own `--host/--port` win over these."""

    host: str | None = None
    port: int | None = None
    discovery: bool = True  # `--no-discovery`: never look for a local server's beacon


TARGET = Target()
_KEY_FLAG: list[str] = []  # `lemonade --api-key KEY ...`, set by the root command


def set_api_key(key: str | None) -> None:
    """The key given on the command line; it wins over the environment for this process only (a
    server that `lemonade run` starts does not inherit it)."""
    _KEY_FLAG[:] = [key] if key else []


def api_key() -> str | None:
    """`--api-key`, else LEMONADE_ADMIN_API_KEY (it works everywhere), else LEMONADE_API_KEY."""
    return next(iter(_KEY_FLAG), None) or os.environ.get("LEMONADE_ADMIN_API_KEY") or os.environ.get("LEMONADE_API_KEY")
