"""Audio containers for the speech worker: float32 mono samples in, the bytes a client asked for out.

Imported by `speech_worker.py` from the engine's private venv (numpy and PyAV, never `lemonade`).
`pcm` is what OpenAI's API means by it: raw 16-bit signed little-endian mono at 24 kHz, so voices
of another rate (Piper's 22.05 kHz) are resampled; `wav` keeps the voice's own rate. mp3, opus
(in Ogg), aac (ADTS) and flac are encoded by FFmpeg through PyAV.
"""

from __future__ import annotations

import io
import wave
from collections.abc import Iterator
from typing import Any

import av
import numpy as np

PCM_RATE = 24000
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
                 "wav": "audio/wav", "pcm": "audio/pcm"}
# format -> (container, codec, sample rate the codec needs or None for the voice's own)
_CODECS: dict[str, tuple[str, str, int | None]] = {
    "mp3": ("mp3", "libmp3lame", None),
    "opus": ("ogg", "libopus", 48000),
    "aac": ("adts", "aac", None),
    "flac": ("flac", "flac", None),
}
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")


def int16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2")


class Resampler:
    """Stateful mono s16 resampling, so chunks resampled one after another join without clicks."""

    def __init__(self, src_rate: int, dst_rate: int) -> None:
        self.src_rate = src_rate
        self.dst_rate = dst_rate
        self._swr: Any = None if src_rate == dst_rate else av.AudioResampler(format="s16", layout="mono",
                                                                              rate=dst_rate)
        self._pts = 0

    def _frames_out(self, frame: Any) -> bytes:
        return b"".join(bytes(f.planes[0])[: f.samples * 2] for f in self._swr.resample(frame))

    def feed(self, samples: np.ndarray) -> bytes:
        data = int16(samples)
        if self._swr is None:
            return data.tobytes()
        frame = av.AudioFrame.from_ndarray(data.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.src_rate
        frame.pts = self._pts
        self._pts += data.shape[0]
        return self._frames_out(frame)

    def flush(self) -> bytes:
        return b"" if self._swr is None else self._frames_out(None)


def pcm_chunks(chunks: Iterator[np.ndarray], rate: int) -> Iterator[bytes]:
    """24 kHz PCM16 bytes for each synthesised chunk, as soon as it exists."""
    resampler = Resampler(rate, PCM_RATE)
    for chunk in chunks:
        data = resampler.feed(chunk)
        if data:
            yield data
    tail = resampler.flush()
    if tail:
        yield tail


def _wav(samples: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(int16(samples).tobytes())
    return buf.getvalue()


def _ffmpeg(samples: np.ndarray, rate: int, fmt: str) -> bytes:
    container, codec, codec_rate = _CODECS[fmt]
    out_rate = codec_rate or rate
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=out_rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(int16(samples).reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate
        frame.pts = 0
        # PyAV converts the frame to the codec's sample format, rate and frame size itself.
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buf.getvalue()


def encode(samples: np.ndarray, rate: int, fmt: str) -> bytes:
    """The whole utterance in `fmt` (one of FORMATS)."""
    if fmt == "wav":
        return _wav(samples, rate)
    if fmt == "pcm":
        return b"".join(pcm_chunks(iter([samples]), rate))
    return _ffmpeg(samples, rate, fmt)
