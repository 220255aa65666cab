"""The faster-whisper engine: Whisper on CTranslate2, a worker process of ours per loaded model.

A Lemonade-in-Python extra that transcribes well on a CPU. The backend is faster-whisper (pinned)
in a private venv (`venv_install.py`); a loaded model is `workers/whisper_worker.py` run with that
venv's Python on a loopback port. Models are CTranslate2 Whisper folders (model.bin, config.json,
tokenizer.json, vocabulary.*), e.g. `Systran/faster-whisper-tiny.en` on Hugging Face.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lemonade.audio.formats import FORMATS
from lemonade.backends.base import WrappedServer
from lemonade.backends.engine import (
    BackendState,
    Engine,
    EngineUnavailable,
    InstallError,
    Launch,
    Option,
    Progress,
)
from lemonade.backends.venv_install import VenvBackend

if TYPE_CHECKING:
    from lemonade.config import Config
    from lemonade.model_info import ModelInfo

FASTER_WHISPER_VERSION = "1.2.1"
PACKAGES = (f"faster-whisper=={FASTER_WHISPER_VERSION}",)
WORKER = Path(__file__).parent / "workers" / "whisper_worker.py"
COMPUTE_TYPES = ("int8", "int8_float32", "float32", "default")


def _check_compute(value: str) -> str | None:
    return None if value in COMPUTE_TYPES else \
        f"Option 'fasterwhisper_compute_type' must be one of {', '.join(COMPUTE_TYPES)}, got '{value}'"


def _check_threads(value: int) -> str | None:
    return None if value >= 0 else f"Option 'fasterwhisper_threads' must be 0 (automatic) or more, got {value}"


def model_folder(files: dict[str, list[Path]]) -> Path:
    """The CTranslate2 folder: the one holding model.bin among the downloaded files."""
    for path in files.get("main", []):
        if path.name == "model.bin":
            return path.parent
    raise EngineUnavailable("The model's files hold no CTranslate2 'model.bin'; it is not a faster-whisper model.",
                            code="model_load_error")


class FasterWhisperEngine(Engine):
    recipe = "fasterwhisper"
    modes = ("transcription",)
    backends = ("cpu",)
    options = {
        "fasterwhisper_compute_type": Option(str, None, default="int8", check=_check_compute),
        "fasterwhisper_threads": Option(int, None, default=0, check=_check_threads),
    }
    backend_option = None
    process = "whisper-worker"
    endpoints = {"audio/transcriptions": "/transcribe"}
    audio_formats = FORMATS  # the worker decodes with PyAV (FFmpeg)

    def __init__(self, cache_dir: Path, config: Config) -> None:
        super().__init__(cache_dir, config)
        self.venv = VenvBackend(cache_dir, self.recipe, "cpu", PACKAGES, probe="import faster_whisper, av")

    def state(self, backend: str) -> BackendState:
        if backend != "cpu":
            return BackendState(self.recipe, backend, "unsupported", message="faster-whisper runs on the CPU only")
        return self.venv.state()

    def install(self, backend: str, progress: Progress = None, force: bool = False) -> dict[str, Any]:
        self.check_request(backend)
        return self.venv.install(progress, force)

    def uninstall(self, backend: str) -> dict[str, Any]:
        if backend != "cpu":
            raise InstallError(f"Unknown {self.recipe} backend '{backend}' (known: cpu).", code="unknown_backend")
        return self.venv.uninstall()

    async def launch(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any],
                     backend: str, port: int) -> Launch:
        folder = model_folder(files)
        argv = [str(self.venv.python), str(WORKER), "--model", str(folder), "--port", str(port),
                "--threads", str(options.get("fasterwhisper_threads") or 0),
                "--compute-type", str(options.get("fasterwhisper_compute_type") or "int8")]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
        server = WrappedServer(f"{self.process}:{model.public}", argv, port, env=env)
        await server.start()
        return Launch(server, dict(options), backend)
