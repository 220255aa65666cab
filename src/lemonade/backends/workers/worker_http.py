"""The HTTP side every worker of ours shares (`whisper_worker.py`, `speech_worker.py`).

Workers run with an engine's private venv, as scripts: this folder is their import path, so they
import this module by its bare name. Plain `http.server`, so no web framework has to be installed
into every engine's venv.
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler
from typing import Any


class JSONHandler(BaseHTTPRequestHandler):
    """Keep-alive HTTP/1.1, one log line per request on stdout (the server's log), JSON replies."""

    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:
        sys.stdout.write(f"{self.command} {fmt % args}\n")
        sys.stdout.flush()

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
