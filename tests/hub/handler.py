"""What every route of the hub's request handler uses: sending answers, reading the body,
finding a repo and a revision. The routes are mixins by concern (files.py, hf_api.py,
modelscope.py, admin.py); server.py puts them together and dispatches.
"""

from __future__ import annotations

import json
import sys
import uuid
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from tests.hub.repos import Repo
from tests.hub.state import Hub, HubError

if TYPE_CHECKING:
    from tests.hub.server import _Server


class HandlerBase(BaseHTTPRequestHandler):
    """The plumbing of the hub's handler; `_dispatch` (server.py) decides what answers."""

    protocol_version = "HTTP/1.1"
    server_version = "LocalHub/1.0"
    timeout = 120
    server: _Server

    # ------------------------------------------------------------ plumbing
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if not self.server.quiet:
            sys.stderr.write(f"[hub:{self.server.role}] {self.address_string()} {format % args}\n")

    @property
    def hub(self) -> Hub:
        return self.server.hub

    def _dispatch(self, method: str) -> None:
        raise NotImplementedError  # server.py's _Handler

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch("HEAD")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        self._body = self.rfile.read(length) if length > 0 else b""
        return self._body

    @property
    def _body_cache(self) -> bytes:
        return getattr(self, "_body", b"")

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              content_type: str | None = "application/json; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("X-Request-Id", uuid.uuid4().hex)
        if content_type:
            self.send_header("Content-Type", content_type)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)
        if self._entry is not None:
            self._entry["status"] = status
            self._entry["bytes_sent"] = 0 if self.command == "HEAD" else len(body)

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    # ------------------------------------------------------ repo lookups
    def _repo(self, repo_id: str) -> Repo:
        repo = self.hub.get_repo(repo_id)
        if repo is None:
            raise HubError(404, "RepoNotFound", "Repository not found")
        return repo

    def _commit(self, repo: Repo, revision: str) -> str:
        commit = repo.resolve_revision(revision)
        if commit is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit
