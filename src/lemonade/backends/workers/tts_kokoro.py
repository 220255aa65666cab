"""Kokoro-82M voices for the speech worker (kokoro-onnx).

The model is one ONNX file (kokoro-onnx's `kokoro-v1.0*.onnx` or onnx-community's
`onnx/model*.onnx`: both input layouts are handled by kokoro-onnx). Voices come as kokoro-onnx's
`voices-*.bin` / `.npz` archive, or as onnx-community's `voices/<name>.bin` files (raw float32
style tables, 256 wide). A voice's first letter is its language (a: American English, b: British,
j: Japanese, ...) and its second its gender, which is how OpenAI voice names are mapped when the
model lacks the voice an OpenAI name prefers. Text is split into sentences here so that each one
can be sent as soon as it is synthesised.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime
from kokoro_onnx import Kokoro

SENTENCE_PAUSE = 0.25
LANGUAGES = {"a": "en-us", "b": "en-gb", "j": "ja", "z": "cmn", "e": "es", "f": "fr-fr", "h": "hi", "i": "it",
             "p": "pt-br"}
# OpenAI voice -> the Kokoro v1.0 voice it stands for (the female/male second letter is the fallback key)
PREFERRED = {"alloy": "af_alloy", "ash": "am_adam", "ballad": "bm_george", "coral": "af_heart", "echo": "am_echo",
             "fable": "bm_fable", "onyx": "am_onyx", "nova": "af_nova", "sage": "af_sarah", "shimmer": "af_sky",
             "verse": "am_michael", "marin": "af_bella", "cedar": "am_eric"}
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+|(?<=[。！？])|\n+")


def load_voices(path: Path) -> dict[str, np.ndarray]:
    """Voice name -> style table (rows by phoneme count, 256 wide)."""
    if path.is_dir():
        return {f.stem: np.fromfile(f, dtype="<f4").reshape(-1, 1, 256) for f in sorted(path.glob("*.bin"))}
    with np.load(path) as archive:
        return {name: np.asarray(archive[name], np.float32) for name in archive.files}


class Synth:
    def __init__(self, model: str, config: str | None, voices: str | None, threads: int) -> None:
        if not voices:
            raise SystemExit("kokoro: --voices (a voices archive or folder) is required")
        self.styles = load_voices(Path(voices))
        if not self.styles:
            raise SystemExit(f"kokoro: no voices found in {voices}")
        opts = onnxruntime.SessionOptions()
        if threads > 0:
            opts.intra_op_num_threads = threads
        session = onnxruntime.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])
        # kokoro-onnx reads its voices from an archive path; hand it ours in that form.
        with tempfile.TemporaryDirectory() as tmp:
            archive = Path(tmp) / "voices.npz"
            np.savez(archive, **self.styles)  # type: ignore[arg-type]  # mypy matches **styles to allow_pickle
            self.kokoro = Kokoro.from_session(session, str(archive))
        self.sample_rate = 24000
        self.voices = sorted(self.styles)

    def default_for(self, openai_voice: str, openai_voices: tuple[str, ...]) -> str:
        want = PREFERRED.get(openai_voice, "af_sky")
        if want in self.styles:
            return want
        same_gender = [v for v in self.voices if len(v) > 1 and v[1] == want[1]]
        return (same_gender or self.voices)[0]

    def sentences(self, text: str, voice: str, speed: float) -> Iterator[np.ndarray]:
        lang = LANGUAGES.get(voice[:1], "en-us")
        pause = np.zeros(int(SENTENCE_PAUSE * self.sample_rate), np.float32)
        parts = [p.strip() for p in _SENTENCE_END.split(text) if p and p.strip()]
        for i, sentence in enumerate(parts):
            audio, _ = self.kokoro.create(sentence, voice=self.styles[voice], speed=speed, lang=lang)
            audio = np.asarray(audio, np.float32)
            yield np.concatenate([pause, audio]) if i else audio
