"""The faster-whisper engine: Whisper on CTranslate2, a worker process of ours per loaded model.

A Lemonade-in-Python extra that transcribes well on a CPU. The backend is faster-whisper (pinned)
in a private venv (`venv_install.py`); a loaded model is `workers/whisper_worker.py` run with that
venv's Python on a loopback port. Models are CTranslate2 Whisper folders (model.bin, config.json,
tokenizer.json, vocabulary.*), e.g. `Systran/faster-whisper-tiny.en` on Hugging Face.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from lemonade.audio.formats import FORMATS
from lemonade.backends.engine import EngineUnavailable, Launch
from lemonade.backends.python_engine import PythonEngine

if TYPE_CHECKING:
    from lemonade.model_info import ModelInfo

FASTER_WHISPER_VERSION = "1.2.1"
WORKER = Path(__file__).parent.parent / "workers" / "whisper_worker.py"


def model_folder(files: dict[str, list[Path]]) -> Path:
    """The CTranslate2 folder: the one holding model.bin among the downloaded files."""
    for path in files.get("main", []):
        if path.name == "model.bin":
            return path.parent
    raise EngineUnavailable("The model's files hold no CTranslate2 'model.bin'; it is not a faster-whisper model.",
                            code="model_load_error")


class FasterWhisperEngine(PythonEngine):
    # memory rule (Engine.memory_need; measured on this machine, docs/memory.md):
    # Whisper tiny.en CT2 (75 MiB) peaked at 250 MiB transcribing
    memory_base_bytes = 160 << 20
    memory_per_weight_byte = 1.5
    recipe = "fasterwhisper"
    packages = (f"faster-whisper=={FASTER_WHISPER_VERSION}",)
    probe = "import faster_whisper, av"
    process = "whisper-worker"
    endpoints = {"audio/transcriptions": "/transcribe"}
    audio_formats = FORMATS  # the worker decodes with PyAV (FFmpeg)

    async def launch(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any],
                     backend: str, port: int) -> Launch:
        folder = model_folder(files)
        return await self.start_worker(model, WORKER, [
            "--model", str(folder), "--threads", str(options.get("fasterwhisper_threads") or 0),
            "--compute-type", str(options.get("fasterwhisper_compute_type") or "int8")], options, backend, port)
