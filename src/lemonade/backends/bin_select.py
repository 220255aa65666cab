"""What every `<engine>.<backend>_bin` setting shares (guide-configuration-README.md, "Backend binary
selection"): `latest` resolved once per process, with the newest release installed before as the
offline fallback, and the answer of a `latest` that cannot be resolved. What a tag or a folder means
for an engine is its own module's: llamacpp_bins.py (llama.cpp), native_bins.py (whisper.cpp and
stable-diffusion.cpp).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lemonade.backends.engine import BackendState, InstallError, Progress
from lemonade.llamacpp_settings import TAG_RE

log = logging.getLogger("lemonade.install")

RETRY_SECONDS = 60  # a failed look-up of `latest` is not repeated sooner (each request would wait on it)


def latest_release_tag(url: str, timeout: float = 5.0) -> str:
    """The `tag_name` of a GitHub releases API answer at `url` (raises on any failure)."""
    import httpx  # a project dependency; imported here so the module loads fast

    resp = httpx.get(url, timeout=timeout, follow_redirects=True, headers={"Accept": "application/json"})
    resp.raise_for_status()
    tag = resp.json().get("tag_name")
    if not isinstance(tag, str) or not TAG_RE.match(tag):
        raise ValueError(f"{url} named no release tag")
    return tag


class LatestTag:
    """`latest` for one upstream project: asked once per server process (a failure is asked again after
    a minute). Offline, with `no_fetch_executables`, or unreachable, the newest tag installed before
    is used, with a warning."""

    def __init__(self, project: str, resolve: Callable[[], str]) -> None:
        self.project = project  # e.g. "llama.cpp", for messages
        self._resolve = resolve
        self.tag: str | None = None
        self._failed: tuple[float, str] | None = None  # when and why the last look-up failed

    @property
    def reason(self) -> str:
        """Why no release could be named (for the state and the install error)."""
        return self._failed[1] if self._failed else "no release known"

    def get(self, key: str, blocked: bool, installed: list[str]) -> str | None:
        """The tag `latest` stands for now; `installed`: tags installed before, newest first."""
        if self.tag is not None:
            return self.tag
        retry = self._failed is None or time.monotonic() - self._failed[0] > RETRY_SECONDS
        if not blocked and retry:
            try:
                self.tag = self._resolve()
                log.info("%s=latest: the newest %s release is %s", key, self.project, self.tag)
                return self.tag
            except Exception as exc:
                self._failed = (time.monotonic(), f"could not ask which {self.project} release is the newest ({exc})")
        elif blocked:
            self._failed = (time.monotonic(), f"offline (or no_fetch_executables), so the newest {self.project} "
                                              "release cannot be looked up, and none is installed")
        if installed:
            log.warning("%s=latest: %s; using %s, the newest one installed", key, self.reason, installed[0])
            return installed[0]
        return None


def installed_tags(root: Path, backend: str) -> list[str]:
    """Release tags installed for `backend` under an engine's `root` (`<backend>@<tag>` folders with an
    install.json), newest first: by the number in the tag (b8664, master-820-de298c2), else by name."""
    import re

    def order(tag: str) -> tuple[int, str]:
        number = re.search(r"\d+", tag)
        return (int(number.group()) if number else -1, tag)

    tags = [p.name.split("@", 1)[1] for p in Path(root).glob(f"{backend}@*") if (p / "install.json").is_file()]
    return sorted(tags, key=order, reverse=True)


class Unresolved:
    """`latest` when no release can be named (offline, or GitHub unreachable, and none installed). Answers
    the queries of both installer kinds (llama.cpp's and the native engines') with "nothing here"."""

    def __init__(self, key: str, reason: str) -> None:
        self.key, self.reason = key, reason

    def state(self, recipe: str, backend: str) -> BackendState:
        return BackendState(recipe, backend, "unsupported", message=f"{self.key}=latest: {self.reason}",
                            action=f"lemonade config set {self.key}=builtin")

    def error(self) -> InstallError:
        return InstallError(f"{self.key}=latest: {self.reason}. Pin a tag, or use the version Lemonade ships: "
                            f"lemonade config set {self.key}=builtin", code="download_failed")

    # llama.cpp's installer queries (llamacpp_bins.py)
    def llama_server_path(self, backend: str) -> Path | None:
        return None

    def rpc_server_path(self, backend: str) -> Path | None:
        return None

    def is_installed(self, backend: str) -> bool:
        return False

    def check_request(self, recipe: str, backend: str, force: bool = False) -> None:
        return None

    def install(self, recipe: str, backend: str, progress: Progress = None, force: bool = False) -> dict[str, Any]:
        raise self.error()

    def uninstall(self, recipe: str, backend: str) -> dict[str, Any]:
        raise self.error()

    # the native engines' queries (native_engine.py)
    def binary(self, name: str, backend: str = "cpu") -> Path | None:
        return None

    def install_pinned(self, backend: str, progress: Progress | None = None, force: bool = False) -> dict[str, Any]:
        raise self.error()

    def remove(self, backend: str) -> dict[str, Any]:
        raise self.error()
