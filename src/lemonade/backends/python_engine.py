"""What every Python-native engine shares (faster-whisper, Piper, Kokoro, ...).

Its backend is pinned PyPI packages in a private venv (`venv_install.py`), on the CPU only, so that
the engine's dependencies never meet the server's; a loaded model is a small worker process of ours
(`workers/`) run with that venv's Python on a loopback port, with the same contract as an engine's
own server (`GET /health`, then its routes). A subclass names its packages, the import that proves
them installed, and the worker's arguments for a model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from lemonade.backends.base import WrappedServer
from lemonade.backends.engine import BackendState, Engine, InstallError, Launch, Progress
from lemonade.backends.venv_install import VenvBackend

if TYPE_CHECKING:
    from lemonade.config import Config
    from lemonade.model_info import ModelInfo


class PythonEngine(Engine):
    """An engine of pinned PyPI packages in a private venv, run by a worker of ours per model."""

    packages: ClassVar[tuple[str, ...]]  # pinned requirements, the engine's own first (its version)
    probe: ClassVar[str]  # a statement that must run in the new venv (e.g. an import)

    def __init__(self, cache_dir: Path, config: Config) -> None:
        super().__init__(cache_dir, config)
        self.venv = VenvBackend(cache_dir, self.recipe, "cpu", self.packages, probe=self.probe)

    def state(self, backend: str) -> BackendState:
        if backend != "cpu":
            return BackendState(self.recipe, backend, "unsupported", message=f"{self.recipe} runs on the CPU only")
        return self.venv.state()

    def install(self, backend: str, progress: Progress = None, force: bool = False) -> dict[str, Any]:
        self.check_request(backend)
        return self.venv.install(progress, force)

    def uninstall(self, backend: str) -> dict[str, Any]:
        if backend != "cpu":
            raise InstallError(f"Unknown {self.recipe} backend '{backend}' (known: cpu).", code="unknown_backend")
        return self.venv.uninstall()

    async def start_worker(self, model: ModelInfo, worker: Path, args: list[str], options: dict[str, Any],
                           backend: str, port: int) -> Launch:
        """Run `worker` with the venv's Python for `model` on `port` and wait until it is ready."""
        argv = [str(self.venv.python), str(worker), *args, "--port", str(port)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
        server = WrappedServer(f"{self.process}:{model.public}", argv, port, env=env)
        await server.start(self.ready_timeout)
        return Launch(server, dict(options), backend)
