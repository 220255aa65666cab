"""The Kokoro engine (`kokoro` recipe, e.g. `kokoro-v1`): Kokoro-82M on ONNX Runtime via kokoro-onnx.

Backend: kokoro-onnx (pinned; espeak-ng through espeakng-loader) and PyAV in a private venv.
A model is one Kokoro ONNX file plus its voices: onnx-community's layout (`onnx/model*.onnx` and
`voices/<name>.bin`, the `kokoro-v1` catalog entry) or kokoro-onnx's (`kokoro-v1.0*.onnx` and a
`voices-*.bin`/`.npz` archive). Voice names carry their language (`af_sky`: American English,
`jf_alpha`: Japanese); espeak-ng makes the phonemes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lemonade.backends.speech_engine import AV_PACKAGE, SpeechEngine, files_named

if TYPE_CHECKING:
    from lemonade.model_info import ModelInfo

KOKORO_ONNX_VERSION = "0.6.1"


class KokoroEngine(SpeechEngine):
    recipe = "kokoro"
    packages = (f"kokoro-onnx=={KOKORO_ONNX_VERSION}", AV_PACKAGE)
    probe = "import kokoro_onnx, av"
    worker_engine = "kokoro"
    process = "kokoro-worker"
    options = SpeechEngine.threads("kokoro")
    speed_range = (0.5, 2.0)  # what kokoro-onnx accepts

    def worker_args(self, model: ModelInfo, files: dict[str, list[Path]]) -> list[str]:
        onnx = files_named(files, ".onnx")
        if not onnx:
            raise self.model_error(model, "Kokoro ONNX model (.onnx)")
        archives = [p for p in files_named(files, ".npz") + files_named(files, ".bin")
                    if p.parent.name != "voices"]
        folders = sorted({p.parent for p in files_named(files, ".bin") if p.parent.name == "voices"})
        voices = archives[0] if archives else folders[0] if folders else None
        if voices is None:
            raise self.model_error(model, "Kokoro voices (voices/*.bin or a voices archive)")
        return ["--model", str(onnx[0]), "--voices", str(voices)]
