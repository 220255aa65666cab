"""pytest fixtures for the local hub.

Use from the root conftest (or a test module) with::

    pytest_plugins = ["tests.hub.pytest_plugin"]

or import the fixture functions into a conftest: ``from tests.hub.pytest_plugin import hub, hub_server``.

(``tests.hub`` must be importable: run pytest from the repo root with ``python -m pytest``, or
add ``pythonpath = ["."]`` to ``[tool.pytest.ini_options]``.)

``hub_server`` (session scope) builds/reuses the fixture repos, starts one hub on 127.0.0.1 and
yields a :class:`HubHandle`.  ``hub`` (function scope) is the same handle after a ``reset()``
(empty request log, no throttle/fail/drop/corrupt rules, default config), which is what most
tests want.

Pointing code at the hub:

- a subprocess (our server, a CLI, a client script): ``env = {**os.environ, **hub.env(tmp_path)}``
  sets ``HF_ENDPOINT``, ``MODELSCOPE_ENDPOINT``, ``HF_HOME`` and quietens huggingface_hub.
  huggingface_hub reads ``HF_ENDPOINT`` once, at import, so the env must be set before the child
  starts; this is the clean way and the one that matches production.
- in-process: pass ``endpoint=hub.url`` to ``hf_hub_download`` / ``snapshot_download`` /
  ``HfApi(endpoint=...)`` (plus ``token=False`` and a ``cache_dir``), after
  ``hub.patch_huggingface_hub(monkeypatch)``, which repoints the import-time constants
  (``constants.ENDPOINT``, ``HUGGINGFACE_CO_URL_TEMPLATE``) and turns telemetry off.  Without the
  patch, the first call of the process still contacts ``https://huggingface.co/api/agent-harnesses``
  (from ``constants.ENDPOINT``) to build its User-Agent.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hub import fixtures as fx
from tests.hub.server import HubServer


class HubHandle:
    """A running local hub: URLs, roots, repo helpers and the admin controls."""

    def __init__(self, server: HubServer, info: fx.FixtureInfo, scratch: Path):
        self.server = server
        self.url = server.url
        self.cdn_url = server.cdn_url
        self.root = info.root
        self.scratch = scratch
        self.fixtures = info
        self._client = httpx.Client(base_url=self.url, timeout=30, trust_env=False)

    # ------------------------------------------------------------- environment
    def env(self, hf_home: str | Path | None = None) -> dict[str, str]:
        """Environment variables that point huggingface_hub (and ModelScope code) at this hub."""
        env = {
            "HF_ENDPOINT": self.url,
            "MODELSCOPE_ENDPOINT": self.url,
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_HUB_DISABLE_UPDATE_CHECK": "1",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
        if hf_home is not None:
            env["HF_HOME"] = str(hf_home)
            env["HF_HUB_CACHE"] = str(Path(hf_home) / "hub")
        return env

    def patch_huggingface_hub(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Repoint an already imported huggingface_hub at this hub (in-process use)."""
        from huggingface_hub import constants

        monkeypatch.setattr(constants, "ENDPOINT", self.url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            self.url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", True)

    # ------------------------------------------------------------------ admin
    def admin(self, action: str, payload: dict[str, Any] | None = None, method: str | None = None) -> Any:
        """Call ``/_admin/<action>``: GET when there is no payload (unless method is given)."""
        method = method or ("POST" if payload is not None else "GET")
        r = self._client.request(method, f"/_admin/{action}", json=payload if method != "GET" else None)
        r.raise_for_status()
        return r.json()

    def reset(self) -> None:
        self.admin("reset", {})

    def clear_requests(self) -> None:
        self.admin("clear_requests", {})

    def requests(self, *, method: str | None = None, repo: str | None = None, file: str | None = None,
                 server: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        """The request log (oldest first), optionally filtered."""
        out = []
        for e in self.admin("requests"):
            if method and e["method"] != method.upper():
                continue
            if repo and e["repo"] != repo:
                continue
            if file and e["file"] != file:
                continue
            if server and e["server"] != server:
                continue
            if kind and e["kind"] != kind:
                continue
            out.append(e)
        return out

    def downloads(self, repo: str | None = None, file: str | None = None) -> list[dict[str, Any]]:
        """GET requests that sent file bytes (from /resolve, the CDN or ModelScope routes)."""
        return [e for e in self.requests(method="GET", repo=repo, file=file)
                if e["kind"] in ("resolve", "cdn", "ms-file") and e["bytes_sent"] > 0]

    def wait_for_download(self, file: str, min_bytes: int = 1, timeout: float = 60,
                          repo: str | None = None) -> dict[str, Any]:
        """Block until a GET of ``file`` has sent at least ``min_bytes`` (e.g. to pause/kill
        a throttled download mid-way); returns that log entry."""
        deadline = time.monotonic() + timeout
        while True:
            for e in reversed(self.downloads(repo=repo, file=file)):
                if e["bytes_sent"] >= min_bytes:
                    return e
            if time.monotonic() > deadline:
                raise TimeoutError(f"no download of {file} reached {min_bytes} bytes in {timeout}s")
            time.sleep(0.05)

    def throttle(self, bytes_per_sec: float | None, path: str | None = None) -> None:
        payload: dict[str, Any] = {"bytes_per_sec": bytes_per_sec}
        if path is not None:
            payload["path"] = path
        self.admin("throttle", payload)

    def fail(self, path: str = "", status: int = 500, count: int | None = 1, *, method: str | None = None,
             server: str | None = None, retry_after: int | None = None, error_code: str | None = None) -> str:
        return self.admin("fail", {"path": path, "status": status, "count": count, "method": method,
                                   "server": server, "retry_after": retry_after,
                                   "error_code": error_code})["id"]

    def drop(self, path: str, after_bytes: int, count: int | None = 1) -> str:
        return self.admin("drop", {"path": path, "after_bytes": after_bytes, "count": count})["id"]

    def delay(self, path: str, seconds: float, count: int | None = 1, method: str | None = None) -> str:
        return self.admin("delay", {"path": path, "seconds": seconds, "count": count, "method": method})["id"]

    def corrupt(self, repo: str, path: str, offset: int | None = None, count: int | None = None) -> str:
        return self.admin("corrupt", {"repo": repo, "path": path, "offset": offset, "count": count})["id"]

    def config(self, **values: Any) -> dict[str, Any]:
        return self.admin("config", values)

    # ------------------------------------------------------------------ repos
    def repo_dir(self, repo_id: str) -> Path:
        """Folder serving ``repo_id`` (scratch first, then the fixture root)."""
        for root in self.server.roots:
            if (root / repo_id).is_dir():
                return root / repo_id
        raise KeyError(repo_id)

    def file_path(self, repo_id: str, filename: str) -> Path:
        return self.repo_dir(repo_id) / filename

    def sha256(self, repo_id: str, filename: str) -> str:
        h = hashlib.sha256()
        with self.file_path(repo_id, filename).open("rb") as f:
            while block := f.read(4 * 1024 * 1024):
                h.update(block)
        return h.hexdigest()

    def commit(self, repo_id: str) -> str:
        return self.admin("repos")[repo_id]["commit"]

    def create_repo(self, repo_id: str, files: dict[str, bytes | str | Path] | None = None,
                    meta: dict[str, Any] | None = None) -> Path:
        """A new repo in the writable scratch root (fresh name per call is the caller's job)."""
        d = self.scratch / repo_id
        d.mkdir(parents=True, exist_ok=True)
        for name, data in (files or {}).items():
            self.write_file(repo_id, name, data)
        if meta is not None:
            (d / ".hub.json").write_text(json.dumps(meta))
        return d

    def clone_repo(self, src_repo: str, dst_repo: str) -> Path:
        """Copy a fixture repo into scratch with hard links (cheap even for the 253 MB Gemma).

        Safe to modify afterwards through :meth:`write_file`, which replaces files instead of
        writing into them (a hard-linked fixture file is never changed in place).
        """
        src = self.repo_dir(src_repo)
        dst = self.scratch / dst_repo
        if dst.exists():
            raise FileExistsError(dst)

        def link(s: str, d: str) -> None:
            try:
                os.link(s, d)
            except OSError:
                shutil.copy2(s, d)

        shutil.copytree(src, dst, copy_function=link)
        return dst

    def write_file(self, repo_id: str, filename: str, data: bytes | str | Path) -> Path:
        """Atomically create/replace a file of a scratch repo (changes the repo's commit)."""
        d = self.scratch / repo_id
        if not d.is_dir():
            raise KeyError(f"{repo_id} is not a scratch repo (use create_repo/clone_repo first)")
        target = d / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".hub-tmp-{uuid.uuid4().hex}")
        if isinstance(data, Path):
            shutil.copyfile(data, tmp)
        else:
            tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, target)
        return target

    def delete_file(self, repo_id: str, filename: str) -> None:
        (self.scratch / repo_id / filename).unlink()

    def clear_scratch(self) -> None:
        """Remove every scratch repo (the fixture repos are never touched)."""
        for child in self.scratch.iterdir():
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()

    def close(self) -> None:
        self._client.close()


@pytest.fixture(scope="session")
def hub_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubHandle]:
    """One local hub for the whole session (fixtures are built once and cached on disk)."""
    info = fx.ensure_fixtures()
    scratch = tmp_path_factory.mktemp("hub-scratch")
    server = HubServer([scratch, info.root]).start()
    handle = HubHandle(server, info, scratch)
    try:
        yield handle
    finally:
        handle.close()
        server.stop()


@pytest.fixture
def hub(hub_server: HubHandle) -> Iterator[HubHandle]:
    """The session hub with a clean slate: empty request log, no rules, default config, and
    the scratch repos created during the test removed afterwards."""
    hub_server.reset()
    yield hub_server
    hub_server.reset()
    hub_server.clear_scratch()
