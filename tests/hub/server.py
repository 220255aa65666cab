"""A small local Hugging Face Hub (plus the ModelScope endpoints we use), for tests.

The real ``huggingface_hub`` client talks to it unchanged: point ``HF_ENDPOINT`` at ``url``
(and ``MODELSCOPE_ENDPOINT`` at the same ``url``).  Everything stays on 127.0.0.1.

This module runs the hub (``HubServer``: a hub listener and a CDN listener in threads, or
``python -m tests.hub.server``) and routes each request; the rest is split by concern, each
module documenting its part of the HTTP contract:

- ``tests.hub.repos``      -- repos on disk: files, hashes, content-based commits, LFS;
- ``tests.hub.state``      -- the hub's shared state: repos, test controls, request log;
- ``tests.hub.handler``    -- what every route uses (answers, body, repo and revision lookups);
- ``tests.hub.files``      -- file downloads (``/resolve``, the CDN, ranges, injected faults);
- ``tests.hub.hf_api``     -- the Hugging Face API (model info, tree, paths-info, refs, search);
- ``tests.hub.modelscope`` -- the ModelScope API (searches, info, file lists, files);
- ``tests.hub.admin``      -- the test controls under ``/_admin/``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.hub.admin import AdminRoutes
from tests.hub.files import FileRoutes
from tests.hub.hf_api import HfRoutes
from tests.hub.modelscope import ModelScopeRoutes
from tests.hub.state import DEFAULT_CONFIG, Hub, HubError, _Ctx, _Rule


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr: tuple[str, int], hub: Hub, role: str, quiet: bool):
        self.hub = hub
        self.role = role
        self.quiet = quiet
        super().__init__(addr, _Handler)


class _Handler(AdminRoutes, FileRoutes, HfRoutes, ModelScopeRoutes):
    """One request: recorded in the log, delayed or failed when a test control says so, then
    routed to the mixin that serves it."""

    # ------------------------------------------------------------- routing
    def _dispatch(self, method: str) -> None:
        self._entry: dict[str, Any] | None = None
        self._body = b""
        self._cut = False
        split = urlsplit(self.path)
        raw_segments = split.path.split("/")[1:]
        segs = [unquote(s) for s in raw_segments]
        decoded_path = "/" + "/".join(segs)
        query = parse_qs(split.query, keep_blank_values=True)
        body = self._read_body() if method in ("POST", "PUT", "DELETE") else b""
        if segs and segs[0] == "_admin":
            try:
                self._admin(method, segs[1:], body)
            except (ValueError, KeyError, TypeError) as exc:
                self._json(400, {"error": f"bad admin request: {exc}"})
            return

        ctx = _Ctx(method=method, server=self.server.role, path=decoded_path)
        route = self._route(method, segs, query, ctx)
        self._entry = self.hub.record({
            "time": time.time(), "server": self.server.role, "method": method, "path": decoded_path,
            "query": split.query, "kind": route[0] if route else "unknown", "repo": ctx.repo,
            "file": ctx.file, "range": self.headers.get("Range"), "status": None, "bytes_sent": 0,
            "completed": False, "injected": None,
            "authorization": self.headers.get("Authorization") is not None,
            "download_counter": self.headers.get("X-HF-Download-Counter") is not None,
            "user_agent": self.headers.get("User-Agent"),
        })
        try:
            delay = self.hub.take_rule("delay", ctx)
            if delay is not None:
                self._entry["injected"] = f"delay {delay.params['seconds']}s"
                time.sleep(float(delay.params["seconds"]))
            fail = self.hub.take_rule("fail", ctx)
            if fail is not None:
                self._inject_failure(fail)
            elif route is None:
                self._json(404, {"error": f"Not found: {decoded_path}"})
            else:
                kind, handler, args = route
                try:
                    handler(*args)
                except HubError as err:
                    (self._ms_error if kind.startswith("ms") else self._hf_error)(err)
            self._entry["completed"] = self._entry.get("status") is not None and not self._cut
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self._entry["aborted"] = True
            self.close_connection = True

    def _inject_failure(self, rule: _Rule) -> None:
        status = int(rule.params.get("status", 500))
        assert self._entry is not None
        self._entry["injected"] = f"fail {status}"
        headers = {"X-Error-Message": f"Injected failure ({status})"}
        if rule.params.get("retry_after") is not None:
            headers["Retry-After"] = str(rule.params["retry_after"])
        if rule.params.get("error_code"):
            headers["X-Error-Code"] = str(rule.params["error_code"])
        self._json(status, {"error": f"Injected failure ({status})"}, headers)

    def _route(self, method: str, segs: list[str], query: dict[str, list[str]], ctx: _Ctx):
        """(kind, handler, args) or None.  Also fills ctx.repo / ctx.file for rule matching."""
        n = len(segs)
        if self.server.role == "cdn" or (n >= 1 and segs[0] == "cdn"):
            if n >= 5 and segs[0] == "cdn" and method in ("GET", "HEAD"):
                ctx.repo, ctx.file = f"{segs[2]}/{segs[3]}", "/".join(segs[4:])
                return "cdn", self._cdn, (segs[1], ctx.repo, ctx.file)
            return None
        if n >= 2 and segs[0] == "api" and segs[1] == "agent-harnesses":
            return "api", self._json, (200, {"standardEnvVars": [], "harnesses": {}})
        if n >= 2 and segs[0] == "api" and segs[1] == "models":
            if n == 2 and method == "GET":
                return "api-list", self._list_models, (query,)
            if n >= 4:
                ctx.repo = f"{segs[2]}/{segs[3]}"
                rest = segs[4:]
                if not rest and method == "GET":
                    return "api-info", self._model_info, (ctx.repo, None, query)
                if rest and rest[0] == "revision" and len(rest) >= 2 and method == "GET":
                    return "api-info", self._model_info, (ctx.repo, "/".join(rest[1:]), query)
                if rest and rest[0] == "tree" and len(rest) >= 2 and method == "GET":
                    sub = "/".join(rest[2:]).strip("/")
                    return "api-tree", self._tree, (ctx.repo, rest[1], sub, query)
                if rest and rest[0] == "paths-info" and len(rest) >= 2 and method == "POST":
                    return "api-paths-info", self._paths_info, (ctx.repo, "/".join(rest[1:]))
                if rest == ["refs"] and method == "GET":
                    return "api-refs", self._refs, (ctx.repo,)
            return None
        if n >= 2 and segs[0] == "openapi" and segs[1] == "v1" and n == 3 and segs[2] == "models":
            return "ms-search", self._ms_openapi_search, (query,)
        if n >= 3 and segs[0] == "api" and segs[1] == "v1":
            if segs[2:] == ["dolphin", "models"] and method in ("GET", "PUT", "POST"):
                return "ms-search", self._ms_dolphin_search, (query,)
            if n >= 5 and segs[2] == "models":
                ctx.repo = f"{segs[3]}/{segs[4]}"
                rest = segs[5:]
                rev = (query.get("Revision") or query.get("revision") or ["master"])[0] or "master"
                if not rest and method == "GET":
                    return "ms-info", self._ms_info, (ctx.repo, rev)
                if rest == ["repo", "files"] and method == "GET":
                    return "ms-files", self._ms_files, (ctx.repo, rev, query)
                if rest == ["repo"] and method in ("GET", "HEAD"):
                    ctx.file = (query.get("FilePath") or query.get("filePath") or [""])[0]
                    return "ms-file", self._serve_repo_file, (ctx.repo, rev, ctx.file, "ms")
            return None
        if n >= 6 and segs[0] == "models" and segs[3] == "resolve" and method in ("GET", "HEAD"):
            ctx.repo, ctx.file = f"{segs[1]}/{segs[2]}", "/".join(segs[5:])
            return "ms-file", self._serve_repo_file, (ctx.repo, segs[4], ctx.file, "ms")
        if n >= 5 and segs[2] == "resolve" and method in ("GET", "HEAD"):
            ctx.repo, ctx.file = f"{segs[0]}/{segs[1]}", "/".join(segs[4:])
            return "resolve", self._serve_repo_file, (ctx.repo, segs[3], ctx.file, "hf")
        return None


class HubServer:
    """Runs a Hub on 127.0.0.1 (hub listener + CDN listener) in background threads.

    >>> with HubServer([root]) as hub:          # doctest: +SKIP
    ...     os.environ["HF_ENDPOINT"] = hub.url
    """

    def __init__(self, roots: Iterable[str | Path], *, host: str = "127.0.0.1", port: int = 0,
                 cdn_port: int = 0, quiet: bool = True):
        self.hub = Hub(roots)
        self.host = host
        self._hub_srv = _Server((host, port), self.hub, "hub", quiet)
        self._cdn_srv = _Server((host, cdn_port), self.hub, "cdn", quiet)
        self.url = f"http://{host}:{self._hub_srv.server_address[1]}"
        self.cdn_url = f"http://{host}:{self._cdn_srv.server_address[1]}"
        self.hub.url, self.hub.cdn_url = self.url, self.cdn_url
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        return int(self._hub_srv.server_address[1])

    @property
    def roots(self) -> list[Path]:
        return self.hub.roots

    def start(self) -> HubServer:
        for srv in (self._hub_srv, self._cdn_srv):
            t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1},
                                 name=f"local-hub-{srv.role}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        for srv in (self._hub_srv, self._cdn_srv):
            srv.shutdown()
            srv.server_close()
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.hub.server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", action="append", default=[], help="repo root (repeatable; first wins)")
    parser.add_argument("--fixtures", action="store_true", help="also serve the standard fixture repos")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = pick a free port")
    parser.add_argument("--cdn-port", type=int, default=0)
    parser.add_argument("--lfs-redirect", choices=["cdn", "none"], default="cdn")
    parser.add_argument("--ready-file", help="write {url, cdn_url, pid} as JSON here once listening")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args(argv)
    roots = list(args.root)
    if args.fixtures:
        from tests.hub.fixtures import ensure_fixtures

        info = ensure_fixtures()
        for repo, reason in info.skipped.items():
            print(f"fixture {repo} skipped: {reason}", file=sys.stderr)
        roots.append(str(info.root))
    if not roots:
        parser.error("give --root DIR and/or --fixtures")
    server = HubServer(roots, host=args.host, port=args.port, cdn_port=args.cdn_port, quiet=not args.verbose)
    server.hub.config["lfs_redirect"] = args.lfs_redirect
    DEFAULT_CONFIG["lfs_redirect"] = args.lfs_redirect
    server.start()
    print(f"HUB_URL={server.url}\nCDN_URL={server.cdn_url}", flush=True)
    if args.ready_file:
        tmp = f"{args.ready_file}.tmp"
        Path(tmp).write_text(json.dumps({"url": server.url, "cdn_url": server.cdn_url, "pid": os.getpid()}))
        os.replace(tmp, args.ready_file)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
