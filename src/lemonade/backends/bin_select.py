"""What every `<engine>.<backend>_bin` setting shares (guide-configuration-README.md, "Backend binary
selection"): `latest` resolved once per process, with the newest release installed before as the
offline fallback, and the answer of a `latest` that cannot be resolved. What a tag or a folder means
for an engine is its own module's: backends/llamacpp/bins.py (llama.cpp), native_bins.py (whisper.cpp and
stable-diffusion.cpp).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lemonade.backends.descriptor import TAG_RE, bin_kind
from lemonade.backends.engine import BackendState, InstallError, Progress

if TYPE_CHECKING:
    from lemonade.config import Config

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


def release_order(tag: str) -> tuple[int, ...]:
    """A release tag's place among its project's releases: its numbers, without a trailing commit
    hash (b8664 -> (8664,); v1.8.5 -> (1, 8, 5); master-820-de298c2 -> (820,))."""
    return tuple(int(n) for n in re.findall(r"\d+", re.sub(r"-[0-9a-f]{7,40}$", "", tag)))


class LatestTag:
    """`latest` for one upstream project: asked once per server process (a failure is asked again after
    a minute). What runs and what is offered (guide-configuration-README.md): the newest release once
    it is installed; until then a release installed before keeps running and the newest is offered
    as an update (`lemonade backends install` applies it), or, with none installed, the newest is
    installed on first use. Offline, with `no_fetch_executables`, or unreachable, the newest tag
    installed before is used, with a warning."""

    def __init__(self, project: str, resolve: Callable[[], str]) -> None:
        self.project = project  # e.g. "llama.cpp", for messages
        self._resolve = resolve
        self.tag: str | None = None
        self._failed: tuple[float, str] | None = None  # when and why the last look-up failed

    @property
    def reason(self) -> str:
        """Why no release could be named (for the state and the install error)."""
        return self._failed[1] if self._failed else "no release known"

    def newest(self, key: str, blocked: bool) -> str | None:
        """The newest upstream release, or None when it cannot be asked now."""
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
        return None

    def choose(self, key: str, blocked: bool, installed: list[str]) -> tuple[str | None, str | None]:
        """(the tag to run, a newer tag to offer as an update or None); `installed`: tags installed
        before, newest first. The tag to run is None when there is none to name."""
        newest = self.newest(key, blocked)
        if newest is None:
            if installed:
                log.warning("%s=latest: %s; using %s, the newest one installed", key, self.reason, installed[0])
                return installed[0], None
            return None, None
        if not installed or newest in installed:
            return newest, None
        if release_order(installed[0]) >= release_order(newest):
            return installed[0], None  # a newer release than the API's newest is installed: keep it
        return installed[0], newest


def installed_tags(root: Path, backend: str) -> list[str]:
    """Release tags installed for `backend` under an engine's `root` (`<backend>@<tag>` folders with an
    install.json), newest first."""
    tags = [p.name.split("@", 1)[1] for p in Path(root).glob(f"{backend}@*") if (p / "install.json").is_file()]
    return sorted(tags, key=lambda t: (release_order(t), t), reverse=True)


def with_update(state: BackendState, offered: str | None, pinned: str, key: str, action: str) -> BackendState:
    """The state of the release `latest` runs, with the guide's two upgrade signals: `update_required`
    when it is older than the version this Lemonade ships, and an offered newer release
    (`update_available`) that the install command applies when the user is ready."""
    if state.state != "installed" or state.version is None:
        return state
    if release_order(state.version) < release_order(pinned):
        return replace(state, state="update_required", action=action,
                       message=f"{key}=latest runs {state.version}, older than {pinned}, the version this Lemonade "
                               f"ships; install the newest release.")
    if offered:
        return replace(state, update_available=offered, action=action,
                       message=f"Update available: {offered} (running {state.version}); {action} applies it.")
    return state


class BinChoice:
    """What one engine's `<section>.<backend>_bin` settings select, the same way for every engine:
    `builtin` the pinned installer, a folder the user's own build (`own`), a tag or `latest` another
    release's installer (`tagged`), each made once per process; and the state with `latest`'s upgrade
    signals. Offline or with `no_fetch_executables`, `latest` is not looked up."""

    def __init__(self, config: Config, latest: LatestTag, root: Path, own: Callable[[Path, str], Any],
                 tagged: Callable[[str], Any]) -> None:
        self.config, self.latest = config, latest
        self.root = root  # the engine's backends folder, whose `<backend>@<tag>` installs `latest` looks at
        self._own, self._tagged = own, tagged
        self._made: dict[tuple[str, str], Any] = {}  # (kind, path or tag) -> own build or installer

    def _latest_choice(self, key: str, backend: str) -> tuple[str | None, str | None]:
        blocked = bool(self.config.get("offline") or self.config.get("no_fetch_executables"))
        return self.latest.choose(key, blocked, installed_tags(self.root, backend))

    def select(self, key: str, builtin: Any, backend: str, installing: bool = False) -> Any:
        """The build setting `key` selects to run, or with `installing`, the one an install applies
        (`latest`'s newer release); `builtin`: the pinned installer."""
        value = self.config.get(key)
        kind = bin_kind(value)
        if kind == "builtin":
            return builtin
        if kind == "path":
            if ("path", value) not in self._made:
                self._made["path", value] = self._own(Path(value), key)
            return self._made["path", value]
        tag = value
        if kind == "latest":
            run, offered = self._latest_choice(key, backend)
            tag = (offered or run) if installing else run
            if tag is None:
                return Unresolved(key, self.latest.reason)
        if ("tag", tag) not in self._made:
            self._made["tag", tag] = self._tagged(tag)
        return self._made["tag", tag]

    def signals(self, state: BackendState, key: str, backend: str, pinned: str, action: str) -> BackendState:
        """`state` with `latest`'s upgrade signals (`with_update`); under any other value as it is."""
        if self.config.get(key) != "latest":
            return state
        return with_update(state, self._latest_choice(key, backend)[1], pinned, key, action)


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

    # llama.cpp's installer queries (backends/llamacpp/bins.py)
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

    def backend_dir(self, backend: str) -> Path:
        raise self.error()

    def install_pinned(self, backend: str, progress: Progress | None = None, force: bool = False) -> dict[str, Any]:
        raise self.error()

    def remove(self, backend: str) -> dict[str, Any]:
        raise self.error()
