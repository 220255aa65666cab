"""The Kokoro engine (`kokoro` recipe, e.g. `kokoro-v1`): Kokoro-82M on ONNX Runtime via kokoro-onnx.

Backend: kokoro-onnx (pinned; espeak-ng through espeakng-loader) and PyAV in a private venv.
A model is one Kokoro ONNX file plus its voices: onnx-community's layout (`onnx/model*.onnx` and
`voices/<name>.bin`) or kokoro-onnx's (`kokoro-v1.0*.onnx` and a `voices-*.bin`/`.npz` archive). A
repository that holds several model files says which pair to use in an `index.json`
(`{"model": ..., "voices": ...}`, paths relative to it): the `kokoro-v1` catalog entry,
`mikkoph/kokoro-onnx`, as upstream Lemonade reads it. Voice names carry their language (`af_sky`: American English,
`jf_alpha`: Japanese); espeak-ng makes the phonemes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from lemonade.backends.speech_engine import AV_PACKAGE, SpeechEngine, files_named

if TYPE_CHECKING:
    from lemonade.model_info import ModelInfo

KOKORO_ONNX_VERSION = "0.6.1"


class KokoroEngine(SpeechEngine):
    # memory rule (Engine.memory_need; measured on this machine, docs/memory.md):
    # Kokoro-82M int8 with its voices (91 MiB) peaked at 609 MiB speaking
    memory_base_bytes = 520 << 20
    memory_per_weight_byte = 1.5
    recipe = "kokoro"
    packages = (f"kokoro-onnx=={KOKORO_ONNX_VERSION}", AV_PACKAGE)
    probe = "import kokoro_onnx, av"
    worker_engine = "kokoro"
    process = "kokoro-worker"
    speed_range = (0.5, 2.0)  # what kokoro-onnx accepts

    def worker_args(self, model: ModelInfo, files: dict[str, list[Path]]) -> list[str]:
        index = [p for p in files_named(files, "index.json") if p.name == "index.json"]
        if index:
            return self._indexed(model, index[0])
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

    def _indexed(self, model: ModelInfo, index: Path) -> list[str]:
        """The model and voices an `index.json` names, both inside its folder."""
        try:
            entry = json.loads(index.read_text(encoding="utf-8"))
            # normpath, not resolve: the snapshot's files are links into the cache's blobs
            pair = [Path(os.path.normpath(index.parent / entry[key])) for key in ("model", "voices")]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise self.model_error(model, f"a readable index.json naming 'model' and 'voices' ({exc})") from None
        if not all(p.is_relative_to(index.parent) and p.exists() for p in pair):
            raise self.model_error(model, "the model and voices files its index.json names")
        return ["--model", str(pair[0]), "--voices", str(pair[1])]
