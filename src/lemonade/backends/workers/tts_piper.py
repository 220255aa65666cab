"""Piper voices for the speech worker (piper-tts, ONNX VITS voices with their `.onnx.json` config).

A single-speaker voice has one voice, named after its dataset (`joe` for en_US-joe-medium), and
every OpenAI voice name means it. A multi-speaker voice (libritts_r, ...) has its speakers as
voices; OpenAI voice names pick speakers in a fixed order, so `alloy` is always the same person.
Piper phonemises the whole text with espeak-ng and then synthesises one sentence at a time, which
is what lets the worker stream.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime
from piper import PiperConfig, PiperVoice, SynthesisConfig

SENTENCE_PAUSE = 0.2  # seconds of silence between sentences, as Piper's own CLI adds


class Synth:
    def __init__(self, model: str, config: str | None, voices: str | None, threads: int) -> None:
        config_path = Path(config) if config else Path(model + ".json")
        settings = json.loads(config_path.read_text(encoding="utf-8"))
        opts = onnxruntime.SessionOptions()
        if threads > 0:
            opts.intra_op_num_threads = threads
        session = onnxruntime.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])
        self.voice = PiperVoice(session=session, config=PiperConfig.from_dict(settings))
        self.sample_rate = self.voice.config.sample_rate
        speakers = self.voice.config.speaker_id_map or {}
        if speakers:
            self.speaker_ids = dict(sorted(speakers.items(), key=lambda kv: kv[1]))
        else:
            name = settings.get("dataset") or Path(model).stem
            self.speaker_ids = {str(name): None}
        self.voices = list(self.speaker_ids)
        self.length_scale = self.voice.config.length_scale or 1.0

    def default_for(self, openai_voice: str, openai_voices: tuple[str, ...]) -> str:
        """The speaker an OpenAI voice name stands for."""
        return self.voices[openai_voices.index(openai_voice) % len(self.voices)]

    def sentences(self, text: str, voice: str, speed: float) -> Iterator[np.ndarray]:
        syn = SynthesisConfig(speaker_id=self.speaker_ids[voice], length_scale=self.length_scale / speed)
        pause = np.zeros(int(SENTENCE_PAUSE * self.sample_rate), np.float32)
        for i, chunk in enumerate(self.voice.synthesize(text, syn)):
            audio = chunk.audio_float_array
            yield np.concatenate([pause, audio]) if i else audio
