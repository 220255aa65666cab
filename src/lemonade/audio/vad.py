"""The realtime API's voice activity detection: RMS energy over 20 ms frames (openai.md, `WS /realtime`).

Pure and synchronous (PCM16 bytes in, events out) so it is tested without a server or a model.
Settings, as the spec names them:

- `threshold` (0.01): RMS of a frame, samples scaled to [-1, 1], above which the frame is speech.
- `prefix_padding_ms` (250): speech must last this long before `speech_started` is reported (the
  spec: "minimum speech duration before triggering"); a click or a cough does not start a turn.
  The same span of audio before the onset is kept for the transcription, so the first syllable is
  never clipped.
- `silence_duration_ms` (800): this much quiet after speech ends the turn (`speech_stopped`).

Times are milliseconds of audio since the session started, as OpenAI's `audio_start_ms` /
`audio_end_ms` are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SAMPLE_RATE = 16000
FRAME_MS = 20
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000
FRAME_BYTES = FRAME_SAMPLES * 2


@dataclass(frozen=True)
class VadSettings:
    threshold: float = 0.01
    silence_duration_ms: int = 800
    prefix_padding_ms: int = 250


@dataclass(frozen=True)
class VadEvent:
    kind: Literal["speech_started", "speech_stopped"]
    ms: int  # speech_started: where the speech began; speech_stopped: where it ended


def frame_rms(frame: bytes) -> float:
    """RMS of little-endian PCM16 samples, scaled to [0, 1]. (numpy on first use: a server that never
    opens a realtime session does not pay its import at start.)"""
    import numpy as np

    samples = np.frombuffer(frame, dtype="<i2").astype(np.float32) / 32768.0
    return float(np.sqrt(np.mean(samples * samples))) if samples.size else 0.0


class EnergyVad:
    """Feed PCM16 (16 kHz mono) in pieces of any size; get the turn boundaries it crosses."""

    def __init__(self, settings: VadSettings | None = None) -> None:
        self.settings = settings or VadSettings()
        self.position_ms = 0  # audio consumed so far (whole frames)
        self.speaking = False
        self._pending = b""  # a partial frame carried to the next feed
        self._onset_ms: int | None = None  # first loud frame of a candidate or current turn
        self._loud_ms = 0  # loud audio since the onset (turn not yet confirmed)
        self._quiet_ms = 0  # quiet audio since the last loud frame
        self._last_loud_end_ms = 0

    def reset(self) -> None:
        """Forget any turn in progress (the buffer was cleared or committed by the client)."""
        self.speaking = False
        self._onset_ms = None
        self._loud_ms = self._quiet_ms = 0

    def keep_from_ms(self) -> int:
        """The earliest audio worth keeping: the padding before a turn (or a candidate turn), else before now."""
        anchor = self._onset_ms if self._onset_ms is not None else self.position_ms
        return max(0, anchor - self.settings.prefix_padding_ms)

    def feed(self, pcm: bytes) -> list[VadEvent]:
        data = self._pending + pcm
        whole = len(data) - len(data) % FRAME_BYTES
        self._pending = data[whole:]
        events: list[VadEvent] = []
        for start in range(0, whole, FRAME_BYTES):
            event = self._frame(frame_rms(data[start:start + FRAME_BYTES]) > self.settings.threshold)
            if event is not None:
                events.append(event)
        return events

    def _frame(self, loud: bool) -> VadEvent | None:
        start = self.position_ms
        self.position_ms += FRAME_MS
        s = self.settings
        if loud:
            self._quiet_ms = 0
            self._last_loud_end_ms = self.position_ms
            if self._onset_ms is None:
                self._onset_ms = start
                self._loud_ms = 0
            self._loud_ms += FRAME_MS
            if not self.speaking and self._loud_ms >= max(s.prefix_padding_ms, FRAME_MS):
                self.speaking = True
                return VadEvent("speech_started", self._onset_ms)
            return None
        if self._onset_ms is None:
            return None
        self._quiet_ms += FRAME_MS
        if self._quiet_ms < s.silence_duration_ms:
            return None
        # Enough quiet: a turn ends, or a candidate that never lasted long enough is dropped.
        was_speaking = self.speaking
        self.reset()
        return VadEvent("speech_stopped", self._last_loud_end_ms) if was_speaking else None
