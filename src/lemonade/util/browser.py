"""Opening the web app in the user's browser (`lemonade open`, `lemonade logs`, `lemonade serve --open`).

Python's `webbrowser` picks the browser; the `BROWSER` environment variable overrides it (a command
with `%s` for the URL), which is also how tests see the URL without a browser.
"""

from __future__ import annotations

import logging
import webbrowser

log = logging.getLogger("lemonade.server")
VIEWS = ("chat", "models", "backends", "logs", "speech", "images")


def app_url(base_url: str, view: str | None = None) -> str:
    """The web app's address on a server: `http://127.0.0.1:13305/#/logs`."""
    return base_url.rstrip("/") + "/" + (f"#/{view}" if view else "")


def local_base_url(host: str, port: int) -> str:
    """Where a browser on this machine reaches a server listening on `host` (any-address -> loopback)."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def open_url(url: str) -> bool:
    """Open `url` in a browser; False when none could be started (the caller prints the URL)."""
    try:
        return webbrowser.open(url)
    except webbrowser.Error as exc:
        log.warning("Could not open a browser for %s: %s", url, exc)
        return False
