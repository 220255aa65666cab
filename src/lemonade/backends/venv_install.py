"""Installing a Python-native engine: pinned PyPI packages into a private virtual environment.

Layout under `<cache>/backends/<recipe>/`:

    <backend>/               the installed backend (appears only when complete)
      venv/                  python -m venv, with the engine's pinned packages
      install.json           {"packages": [...], "python": ..., "installed_at": ...}
    <backend>-install.log    pip's full output of the last attempt
    .<backend>.tmp-*         an install in progress (swept by the next attempt)

The venv is created in a temp sibling and renamed into place only after the packages import, so a
failed or interrupted install never looks installed and a reinstall never removes a working one
first. Only plain `pip install` arguments are used: every pip that can create a venv understands
them (no progress-bar styles, no resolver flags), and pip's own configuration (index URL, proxy,
certificates) applies as it does for the user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lemonade.backends.engine import BackendState, InstallError, Progress, install_action
from lemonade.paths import backends_dir
from lemonade.util.atomic import atomic_write_json, read_json

INSTALL_JSON = "install.json"


def _emit(progress: Progress, phase: str, message: str, percent: float | None = None) -> None:
    if progress is not None:
        try:
            progress({"phase": phase, "message": message, "percent": percent})
        except Exception:  # a closed SSE stream never stops an install
            pass


class VenvBackend:
    """One backend of a Python-native engine: `packages` (pinned) in a private venv."""

    def __init__(self, cache_dir: Path, recipe: str, backend: str, packages: Sequence[str], probe: str) -> None:
        self.recipe = recipe
        self.backend = backend
        self.packages = list(packages)
        self.probe = probe  # a Python statement that must run in the new venv (e.g. an import)
        self.root = backends_dir(Path(cache_dir)) / recipe
        self.dir = self.root / backend
        self.log_path = self.root / f"{backend}-install.log"

    @property
    def python(self) -> Path:
        return self.dir / "venv" / "bin" / "python"

    def info(self) -> dict[str, Any] | None:
        try:
            data = read_json(self.dir / INSTALL_JSON, None)
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def state(self) -> BackendState:
        action = install_action(self.recipe, self.backend)
        want = " ".join(self.packages)
        info = self.info()
        if info is None or not self.python.exists():
            return BackendState(self.recipe, self.backend, "installable", devices=["cpu"], action=action,
                                message=f"Backend is supported but not installed. Installing it puts {want} "
                                        "into a private Python environment (a download of about 100 MB).")
        if info.get("packages") != self.packages:
            return BackendState(self.recipe, self.backend, "update_required", devices=["cpu"], action=action,
                                message=f"Backend update is required before use (installed "
                                        f"{' '.join(info.get('packages') or [])}, this Lemonade uses {want}).")
        return BackendState(self.recipe, self.backend, "installed", devices=["cpu"],
                            version=self.packages[0].split("==")[-1])

    def install(self, progress: Progress = None, force: bool = False) -> dict[str, Any]:
        result = {"status": "success", "recipe": self.recipe, "backend": self.backend}
        if self.state().state == "installed" and not force:
            _emit(progress, "done", f"{self.recipe}:{self.backend} is already installed", 100.0)
            return {**result, "version": self.state().version}
        self.root.mkdir(parents=True, exist_ok=True)
        from filelock import FileLock  # installs only: not imported by a server start

        with FileLock(str(self.root / ".install.lock")):
            if self.state().state == "installed" and not force:
                return {**result, "version": self.state().version}
            for old in self.root.glob(f".{self.backend}.tmp-*"):
                shutil.rmtree(old, ignore_errors=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{self.backend}.tmp-", dir=self.root))
            try:
                self._build(staging, progress)
                self._swap_into_place(staging)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        _emit(progress, "done", f"Installed {self.recipe}:{self.backend}", 100.0)
        return {**result, "version": self.state().version}

    def _build(self, staging: Path, progress: Progress) -> None:
        venv = staging / "venv"
        with open(self.log_path, "w", encoding="utf-8", errors="replace") as log:
            _emit(progress, "install", f"Creating a Python environment for {self.recipe}", 2.0)
            self._run([sys.executable, "-m", "venv", str(venv)], log)
            py = venv / "bin" / "python"
            _emit(progress, "download", f"Installing {' '.join(self.packages)} (pip)", 5.0)
            self._run([str(py), "-m", "pip", "install", "--disable-pip-version-check", *self.packages], log,
                      progress)
            _emit(progress, "install", "Checking the new environment", 95.0)
            self._run([str(py), "-c", self.probe], log)
        atomic_write_json(staging / INSTALL_JSON, {
            "recipe": self.recipe, "backend": self.backend, "packages": self.packages,
            "python": sys.version.split()[0], "installed_at": datetime.now(UTC).isoformat(timespec="seconds")})
        (staging / INSTALL_JSON).chmod(0o644)
        staging.chmod(0o755)

    def _run(self, argv: list[str], log: Any, progress: Progress = None) -> None:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PIP_NO_INPUT": "1"})
        assert proc.stdout is not None
        tail: list[str] = []
        collected = 0
        for line in proc.stdout:
            log.write(line)
            tail = (tail + [line.rstrip()])[-30:]
            if progress is not None and line.startswith(("Collecting ", "Downloading ", "Installing ")):
                collected += 1
                _emit(progress, "download", line.strip(), min(90.0, 5.0 + collected * 2.0))
        code = proc.wait()
        log.flush()
        if code != 0:
            offline = any(m in " ".join(tail) for m in ("No matching distribution", "Could not find a version",
                                                         "Failed to establish", "Temporary failure"))
            hint = ("The package index is unreachable: connect to the internet (or configure pip's index, "
                    "e.g. PIP_INDEX_URL) and run: " if offline else "Fix the problem shown and run: ")
            step = argv[2] if len(argv) > 2 else argv[0]
            raise InstallError(f"Installing {self.recipe}:{self.backend} failed ({step} exited with {code}). "
                               f"{hint}{install_action(self.recipe, self.backend)}\n"
                               f"Full log: {self.log_path}\n--- last lines ---\n" + "\n".join(tail),
                               code="install_failed", log_path=self.log_path)

    def _swap_into_place(self, staging: Path) -> None:
        old: Path | None = None
        if self.dir.exists() or self.dir.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=f".{self.backend}.tmp-old-", dir=self.root))
            os.replace(self.dir, old / self.backend)
        os.replace(staging, self.dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def uninstall(self) -> dict[str, Any]:
        result: dict[str, Any] = {"status": "success", "recipe": self.recipe, "backend": self.backend}
        self.root.mkdir(parents=True, exist_ok=True)
        from filelock import FileLock

        with FileLock(str(self.root / ".install.lock")):
            if not (self.dir.exists() or self.dir.is_symlink()):
                return {**result, "message": f"{self.recipe}:{self.backend} was not installed"}
            trash = Path(tempfile.mkdtemp(prefix=f".{self.backend}.tmp-", dir=self.root))
            os.replace(self.dir, trash / self.backend)
            shutil.rmtree(trash, ignore_errors=True)
            self.log_path.unlink(missing_ok=True)
        return result
