"""Serving a repo's files: `/resolve` (and ModelScope's file routes), the CDN redirect of LFS
files and the second listener that answers it, byte ranges, and the download faults the tests
inject (drop, corrupt, throttle).
"""

from __future__ import annotations

import hashlib
import socket
import time
import uuid
from datetime import UTC, datetime
from urllib.parse import quote, unquote, urlencode, urlsplit

from tests.hub.handler import HandlerBase
from tests.hub.repos import FileEntry, Repo
from tests.hub.state import HubError, _Ctx


class FileRoutes(HandlerBase):
    def _serve_repo_file(self, repo_id: str, revision: str, path: str, flavour: str) -> None:
        repo = self._repo(repo_id)
        commit = self._commit(repo, revision)
        entry = repo.files.get(path.strip("/"))
        if entry is None:
            raise HubError(404, "EntryNotFound", f"Entry not found: {path}", {"X-Repo-Commit": commit})
        headers = {"X-Repo-Commit": commit, "ETag": f'"{entry.etag}"', "Vary": "Origin, Accept"}
        if entry.lfs:
            headers["X-Linked-Size"] = str(entry.size)
            headers["X-Linked-Etag"] = f'"{entry.sha256}"'
        if entry.lfs and self.hub.config.get("lfs_redirect") == "cdn" and self.hub.cdn_url:
            sig = hashlib.sha1(f"{entry.sha256}{commit}".encode()).hexdigest()[:32]
            location = (f"{self.hub.cdn_url}/cdn/{entry.sha256}/{repo.repo_id}/{quote(entry.path)}?"
                        + urlencode({"X-Amz-Expires": "3600", "X-Amz-Signature": sig}))
            headers["Location"] = location
            body = f"Found. Redirecting to {location}".encode()
            return self._send(302, body, headers, content_type="text/plain; charset=utf-8")
        self._serve_bytes(repo, entry, headers)

    def _cdn(self, sha256: str, repo_id: str, path: str) -> None:
        repo = self.hub.get_repo(repo_id)
        entry = repo.files.get(path) if repo else None
        if entry is None or entry.sha256 != sha256:
            denied = b"<Error><Code>AccessDenied</Code></Error>"
            return self._send(403, denied, content_type="application/xml")
        self._serve_bytes(repo, entry, {"ETag": f'"{entry.sha256}"'})  # type: ignore[arg-type]

    def _serve_bytes(self, repo: Repo, entry: FileEntry, headers: dict[str, str]) -> None:
        size = entry.size
        start, end = 0, size - 1
        status = 200
        range_header = self.headers.get("Range")
        if range_header:
            parsed = _parse_range(range_header, size)
            if parsed == "unsatisfiable":
                headers = {**headers, "Content-Range": f"bytes */{size}"}
                return self._send(416, b"", headers, content_type=None)
            if parsed is not None:
                start, end = parsed
                status = 206
        length = max(0, end - start + 1)
        name = entry.path.rsplit("/", 1)[-1]
        self.send_response(status)
        self.send_header("X-Request-Id", uuid.uuid4().hex)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        disposition = f"inline; filename*=UTF-8''{quote(name)}; filename=\"{name}\";"
        self.send_header("Content-Disposition", disposition)
        self.send_header("Last-Modified", datetime.fromtimestamp(entry.mtime, tz=UTC)
                         .strftime("%a, %d %b %Y %H:%M:%S GMT"))
        for k, v in headers.items():
            self.send_header(k, v)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(length))
        self.end_headers()
        assert self._entry is not None
        self._entry["status"] = status
        if self.command == "HEAD" or length == 0:
            return
        ctx = _Ctx(method=self.command, server=self.server.role, path=unquote(urlsplit(self.path).path),
                   repo=repo.repo_id, file=entry.path)
        drop = self.hub.take_rule("drop", ctx)
        drop_after = int(drop.params["after_bytes"]) if drop is not None else None
        if drop is not None:
            self._entry["injected"] = f"drop after {drop_after}"
        corrupt_at = self.hub.corrupt_offset(repo.repo_id, entry.path, size)
        if corrupt_at is not None:
            self._entry["injected"] = f"corrupt byte {corrupt_at}"
        sent = 0
        pos = start
        with entry.abspath.open("rb") as f:
            f.seek(start)
            while sent < length:
                rate = self.hub.rate_for(ctx)
                chunk = 1024 * 1024 if not rate else int(max(4096, min(1024 * 1024, rate / 20)))
                n = min(chunk, length - sent)
                if drop_after is not None:
                    n = min(n, drop_after - sent)
                    if n <= 0:
                        break
                data = f.read(n)
                if not data:
                    break
                if corrupt_at is not None and pos <= corrupt_at < pos + len(data):
                    buf = bytearray(data)
                    buf[corrupt_at - pos] ^= 0xFF
                    data = bytes(buf)
                self.wfile.write(data)
                sent += len(data)
                pos += len(data)
                self._entry["bytes_sent"] = sent
                if rate:
                    time.sleep(len(data) / rate)
        if sent < length:
            # Either a drop rule or the file shrank under us: cut the connection like a flaky network.
            self._cut = True
            self.close_connection = True
            try:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _parse_range(header: str, size: int) -> tuple[int, int] | str | None:
    """(start, end) inclusive, "unsatisfiable", or None to ignore the header."""
    h = header.strip().lower()
    if not h.startswith("bytes=") or "," in h:
        return None
    spec = h[len("bytes="):].strip()
    first, _, last = spec.partition("-")
    try:
        if first == "":
            n = int(last)
            if n <= 0:
                return "unsatisfiable"
            return max(0, size - n), size - 1
        start = int(first)
        end = int(last) if last else size - 1
    except ValueError:
        return None
    if start >= size or start > end:
        return "unsatisfiable"
    return start, min(end, size - 1)
