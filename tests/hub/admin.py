"""The hub's test controls under `/_admin/`.

Test controls (JSON bodies, never query strings; not recorded in the request log)
-------------------------------------------------------------------------------
``GET  /_admin/health``    -> ``{"ok": true, "url", "cdn_url", "roots"}``
``GET  /_admin/requests``  -> list of every non-admin request, oldest first: ``{"id", "time",
    "server": "hub"|"cdn", "method", "path" (decoded), "query", "kind" ("resolve", "cdn",
    "api", "ms-file", ...), "repo", "file", "range", "status", "bytes_sent", "completed",
    "injected", "authorization" (bool), "download_counter" (bool), "user_agent"}``.
``POST /_admin/clear_requests``  empties the log.
``POST /_admin/reset``     clears the log, every rule below and the config.
``POST /_admin/throttle {"bytes_per_sec": N, "path": "substr"?}``  (N null/0 removes it).
``POST /_admin/fail {"path": "substr", "status": 500, "count": 1, "method"?, "server"?,
    "retry_after"?, "error_code"?}``  -- the next ``count`` matching requests get ``status``
    (``count`` null = forever).
``POST /_admin/drop {"path": "substr", "after_bytes": N, "count": 1}``  -- send N body bytes of
    the next matching download, then cut the connection (the client sees a truncated body).
``POST /_admin/delay {"path": "substr", "seconds": S, "count": 1, "method"?}``  -- stall first.
``POST /_admin/corrupt {"repo", "path", "offset"?, "count"?}``  -- serve that file with one byte
    flipped (default: the middle byte) while every header still announces the true sha256.
``POST /_admin/config {"lfs_redirect": "cdn"|"none", "tree_page_size": N,
    "models_page_size": N}``
``GET  /_admin/repos``     -> ``{repo_id: {"commit", "root", "files": {path: {size, sha256, lfs}}}}``

A ``path`` pattern matches when it is a substring of the decoded URL path or of
``"<repo_id>/<file path>"``; ``""`` matches every request.
"""

from __future__ import annotations

import json
from typing import Any

from tests.hub.handler import HandlerBase
from tests.hub.state import DEFAULT_CONFIG, _Rule


class AdminRoutes(HandlerBase):
    def _admin(self, method: str, segs: list[str], body: bytes) -> None:
        hub = self.hub
        payload: dict[str, Any] = json.loads(body) if body.strip() else {}
        action = "/".join(segs)
        if method == "GET" and action == "health":
            return self._json(200, {"ok": True, "url": hub.url, "cdn_url": hub.cdn_url,
                                    "roots": [str(r) for r in hub.roots]})
        if method == "GET" and action == "requests":
            return self._json(200, hub.requests_snapshot())
        if method == "GET" and action == "repos":
            out = {}
            for repo in hub.all_repos():
                out[repo.repo_id] = {
                    "commit": repo.commit, "root": str(repo.root),
                    "files": {p: {"size": e.size, "sha256": e.sha256, "lfs": e.lfs}
                              for p, e in repo.files.items()},
                }
            return self._json(200, out)
        if method == "GET" and action == "config":
            return self._json(200, hub.config)
        if method != "POST":
            return self._json(404, {"error": f"unknown admin endpoint {method} /_admin/{action}"})
        if action == "reset":
            hub.reset()
            return self._json(200, {"ok": True})
        if action == "clear_requests":
            with hub.lock:
                hub.log.clear()
            return self._json(200, {"ok": True})
        if action == "throttle":
            rate = payload.get("bytes_per_sec")
            pattern = payload.get("path") or ""
            with hub.lock:
                if rate:
                    hub.throttles[pattern] = float(rate)
                elif "path" in payload:
                    hub.throttles.pop(pattern, None)
                else:
                    hub.throttles.clear()
                current = dict(hub.throttles)
            return self._json(200, {"ok": True, "throttles": current})
        if action in ("fail", "drop", "delay", "corrupt"):
            count = payload.get("count", None if action == "corrupt" else 1)
            rule = _Rule(kind=action, path=payload.get("path") or "", count=count,
                         method=payload.get("method"), server=payload.get("server"))
            if action == "fail":
                rule.params = {"status": int(payload.get("status", 500)),
                               "retry_after": payload.get("retry_after"),
                               "error_code": payload.get("error_code")}
            elif action == "drop":
                rule.params = {"after_bytes": int(payload["after_bytes"])}
            elif action == "delay":
                rule.params = {"seconds": float(payload["seconds"])}
            else:
                rule.params = {"repo": payload["repo"], "path": payload["path"],
                               "offset": payload.get("offset")}
                rule.path = ""
            with hub.lock:
                hub.rules.append(rule)
            return self._json(200, {"ok": True, "id": rule.id})
        if action == "config":
            unknown = set(payload) - set(DEFAULT_CONFIG)
            if unknown:
                raise ValueError(f"unknown config keys {sorted(unknown)}")
            if payload.get("lfs_redirect", "cdn") not in ("cdn", "none"):
                raise ValueError("lfs_redirect must be 'cdn' or 'none'")
            with hub.lock:
                hub.config.update(payload)
                current = dict(hub.config)
            return self._json(200, current)
        return self._json(404, {"error": f"unknown admin endpoint POST /_admin/{action}"})
