"""`whispercpp.cpu_bin` and `sdcpp.cpu_bin`: which whisper.cpp or stable-diffusion.cpp a native engine
runs (guide-configuration-README.md, "Backend binary selection"), as backends/llamacpp/bins.py does for llama.cpp.

- `"builtin"` (or `""`): the pinned version, installed by the engine's `NativeInstall` (a release
  archive where upstream publishes one, else a source build of the pinned sources);
- a release tag (`"v1.8.4"`, `"master-820-de298c2"`): that upstream release's archive, installed
  beside the pinned one in `<cache>/backends/<recipe>/<backend>@<tag>/`. Release archives only: where
  upstream publishes none for this platform (whisper.cpp on Linux and macOS), the state says so and
  names the two other ways;
- `"latest"`: the newest upstream release (GitHub's releases API, `LEMONADE_GITHUB_API_URL` to ask a
  stand-in), resolved once per process, then installed like a tag (bin_select.py);
- an absolute path: a folder with your own build (`whisper-server`; `sd-server`, with `sd-cli` for
  upscaling). Used as it is: never downloaded into, never removed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lemonade.backends.engine import BackendState, InstallError, Progress
from lemonade.backends.native_build import emit


class OwnNativeBuild:
    """A native engine built by the user, in a folder of theirs: the `NativeInstall` queries over it."""

    tag = None

    def __init__(self, folder: Path, key: str, executables: tuple[str, ...]) -> None:
        self.folder = folder
        self.key = key  # the setting that names it, for messages
        self.executables = executables  # the server first; the others are used when present
        self.version = "own build"

    def backend_dir(self, backend: str) -> Path:
        return self.folder

    def binary(self, name: str, backend: str = "cpu") -> Path | None:
        exe = self.folder / name
        return exe if exe.is_file() and os.access(exe, os.X_OK) else None

    def state(self, recipe: str, backend: str) -> BackendState:
        server = self.executables[0]
        if self.binary(server) is None:
            return BackendState(recipe, backend, "unsupported",
                                message=f"{self.key} points at {self.folder}, which holds no runnable {server}",
                                action=f"lemonade config set {self.key}=builtin")
        return BackendState(recipe, backend, "installed", version=self.version, devices=[backend],
                            message=f"your own build in {self.folder} ({self.key})")

    def install_pinned(self, backend: str, progress: Progress | None = None, force: bool = False) -> dict[str, Any]:
        st = self.state("", backend)
        if st.state != "installed":
            raise InstallError(f"{st.message}. Lemonade never downloads into your own build's folder; fix it, or "
                               f"use the version Lemonade ships: {st.action}", code="not_found")
        emit(progress, "done", f"Using your own build in {self.folder}", 100.0)
        return {"status": "success", "backend": backend, "version": self.version}

    def remove(self, backend: str) -> dict[str, Any]:
        raise InstallError(f"{self.key} points at your own build in {self.folder}; Lemonade does not remove it. "
                           f"Set {self.key}=builtin to use the version Lemonade ships.", code="unsupported_backend")
