"""What every text-to-speech engine shares: a private venv and our speech worker per loaded model.

A TTS engine (`piper.py`, `kokoro.py`) is pinned PyPI packages in a private venv (`venv_install.py`)
plus PyAV for the mp3/opus/aac/flac encoders; a loaded model is `workers/speech_worker.py` run with
that venv's Python on a loopback port, told which voice module to use. A subclass says which
packages, which files of a model are which (`worker_args`), the speeds its engine accepts and
which `response_format`s it encodes, buffered and streamed; `/v1/audio/speech` reads those.
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from lemonade.backends.engine import Engine, EngineUnavailable, Launch
from lemonade.backends.python_engine import PythonEngine

if TYPE_CHECKING:
    from lemonade.model_info import ModelInfo

WORKER = Path(__file__).parent / "workers" / "speech_worker.py"
AV_PACKAGE = "av==18.1.0"  # FFmpeg encoders (libmp3lame, libopus, aac, flac) for the worker
ENCODED_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")


def files_named(files: dict[str, list[Path]], suffix: str) -> list[Path]:
    return [p for paths in files.values() for p in paths if p.name.endswith(suffix)]


class SpeechService(Engine):
    """What `/v1/audio/speech` asks of a text-to-speech engine (serving/speech.py reads it before a
    model loads): the response formats it encodes, buffered and streamed, and the speeds it takes.
    The request itself is `{"input", "voice", "speed", "response_format", "stream"}` at the engine's
    `audio/speech` path."""

    speech_formats: ClassVar[tuple[str, ...]] = ENCODED_FORMATS  # buffered response formats
    stream_formats: ClassVar[tuple[str, ...]] = ("pcm",)  # streamed response formats
    speed_range: ClassVar[tuple[float, float]] = (0.25, 4.0)


class SpeechEngine(PythonEngine, SpeechService):
    """A Python-native TTS engine run by our speech worker."""

    endpoints = {"audio/speech": "/speech"}
    worker_engine: ClassVar[str]  # the worker's voice module: workers/tts_<name>.py

    @property
    def threads_option(self) -> str:
        return f"{self.recipe}_threads"

    @abstractmethod
    def worker_args(self, model: ModelInfo, files: dict[str, list[Path]]) -> list[str]:
        """`--model FILE` and what else the worker needs to find this model's files."""

    def model_error(self, model: ModelInfo, what: str) -> EngineUnavailable:
        return EngineUnavailable(f"Model {model.public}: its files hold no {what}; it is not a {self.recipe} model.",
                                 code="model_load_error")

    async def launch(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any],
                     backend: str, port: int) -> Launch:
        args = ["--engine", self.worker_engine, *self.worker_args(model, files),
                "--threads", str(options.get(self.threads_option) or 0)]
        return await self.start_worker(model, WORKER, args, options, backend, port)
