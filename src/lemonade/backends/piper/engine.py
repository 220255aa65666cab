"""The Piper engine (`piper` recipe): fast local neural voices, a Lemonade-in-Python extra.

Backend: piper-tts (pinned; it brings espeak-ng for phonemes and ONNX Runtime) and PyAV in a
private venv. A model is one Piper voice: its `.onnx` file and the `.onnx.json` config next to it
(checkpoint roles `main` and `config`), e.g. `rhasspy/piper-voices:en/en_US/joe/medium/...` on
Hugging Face. Multi-speaker voices list their speakers as voices.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lemonade.backends.speech_engine import AV_PACKAGE, SpeechEngine, files_named

if TYPE_CHECKING:
    from lemonade.model_info import ModelInfo

PIPER_VERSION = "1.8.0"


class PiperEngine(SpeechEngine):
    # memory rule (Engine.memory_need; measured on this machine, docs/memory.md):
    # the joe medium voice (60 MiB) peaked at 255 MiB speaking
    memory_base_bytes = 185 << 20
    memory_per_weight_byte = 1.5
    recipe = "piper"
    packages = (f"piper-tts=={PIPER_VERSION}", AV_PACKAGE)
    probe = "import piper, av"
    worker_engine = "piper"
    process = "piper-worker"

    def worker_args(self, model: ModelInfo, files: dict[str, list[Path]]) -> list[str]:
        onnx = files_named(files, ".onnx")
        if not onnx:
            raise self.model_error(model, "Piper voice (.onnx)")
        config = files_named(files, ".onnx.json") or [onnx[0].with_name(onnx[0].name + ".json")]
        if not config[0].is_file():
            raise self.model_error(model, "voice config (.onnx.json) next to the .onnx file")
        return ["--model", str(onnx[0]), "--config", str(config[0])]
