"""The pure parts of speech input: the realtime API's energy VAD (`audio/vad.py`), its session
settings (`api/openai/realtime_protocol.py`) and the container check of uploads (`audio/formats.py`).
Signals are synthesised tones and silence with known boundaries, so every time is checkable."""

from __future__ import annotations

import numpy as np
import pytest

from lemonade.api.openai.realtime_protocol import ProtocolError, SessionConfig, apply_update, session_view
from lemonade.audio import formats
from lemonade.audio.vad import SAMPLE_RATE, EnergyVad, VadSettings, frame_rms


def tone(ms: int, amplitude: float = 0.3, hz: float = 220.0) -> np.ndarray:
    t = np.arange(SAMPLE_RATE * ms // 1000) / SAMPLE_RATE
    return amplitude * np.sin(2 * np.pi * hz * t)


def silence(ms: int) -> np.ndarray:
    return np.zeros(SAMPLE_RATE * ms // 1000)


def pcm16(*parts: np.ndarray) -> bytes:
    return (np.clip(np.concatenate(parts), -1, 1) * 32767).astype("<i2").tobytes()


def run(vad: EnergyVad, pcm: bytes, chunk_ms: int = 85) -> list[tuple[str, int]]:
    """Events from feeding `pcm` in chunks of `chunk_ms` (85 ms is not a whole number of frames)."""
    step = SAMPLE_RATE * chunk_ms // 1000 * 2
    return [(e.kind, e.ms) for i in range(0, len(pcm), step) for e in vad.feed(pcm[i:i + step])]


def test_rms_of_a_sine_is_its_amplitude_over_root_two():
    assert frame_rms(pcm16(tone(20, 0.5, 1000))) == pytest.approx(0.5 / np.sqrt(2), rel=0.01)
    assert frame_rms(pcm16(silence(20))) == 0.0


def test_one_turn_with_its_boundaries():
    vad = EnergyVad()
    events = run(vad, pcm16(silence(1000), tone(1500), silence(1200)))
    assert events == [("speech_started", 1000), ("speech_stopped", 2500)]
    assert not vad.speaking


def test_chunking_does_not_change_the_events():
    audio = pcm16(silence(500), tone(700), silence(300), tone(400), silence(1000))
    whole = run(EnergyVad(), audio, chunk_ms=10_000)
    assert run(EnergyVad(), audio, chunk_ms=85) == whole == run(EnergyVad(), audio, chunk_ms=7)
    # a 300 ms pause is shorter than silence_duration_ms: still one turn
    assert whole == [("speech_started", 500), ("speech_stopped", 1900)]


def test_sound_shorter_than_prefix_padding_starts_no_turn():
    vad = EnergyVad()
    assert run(vad, pcm16(silence(300), tone(200), silence(1500))) == []
    assert run(EnergyVad(VadSettings(prefix_padding_ms=100)), pcm16(silence(300), tone(200), silence(1500))) == [
        ("speech_started", 300), ("speech_stopped", 500)]


def test_settings_are_honoured():
    quiet = pcm16(silence(200), tone(1000, amplitude=0.01), silence(1000))  # RMS about 0.007
    assert run(EnergyVad(), quiet) == []
    assert run(EnergyVad(VadSettings(threshold=0.005)), quiet) == [("speech_started", 200), ("speech_stopped", 1200)]
    short_pause = pcm16(tone(500), silence(400), tone(500), silence(500))
    assert [k for k, _ in run(EnergyVad(VadSettings(silence_duration_ms=300)), short_pause)] == [
        "speech_started", "speech_stopped", "speech_started", "speech_stopped"]
    assert [k for k, _ in run(EnergyVad(), short_pause)] == ["speech_started"]  # still speaking at the end


def test_keep_from_keeps_the_padding_before_an_onset():
    vad = EnergyVad()
    run(vad, pcm16(silence(2000)))
    assert vad.keep_from_ms() == 2000 - 250
    run(vad, pcm16(tone(100)))  # a candidate onset at 2000 ms, not yet a turn
    assert vad.keep_from_ms() == 2000 - 250 and not vad.speaking


def test_session_update_shapes():
    config = apply_update(SessionConfig(), {"model": "Whisper-Tiny",
                                            "turn_detection": {"threshold": 0.02, "silence_duration_ms": 500}})
    assert config.model == "Whisper-Tiny" and config.vad == VadSettings(0.02, 500, 250)
    assert apply_update(config, {"turn_detection": None}).vad is None
    beta = apply_update(SessionConfig(), {"input_audio_transcription": {"model": "W", "language": "en"},
                                          "instructions": "ignored", "input_audio_format": "pcm16"})
    assert (beta.model, beta.language) == ("W", "en")
    ga = apply_update(SessionConfig(), {"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": 16000}, "transcription": {"model": "W"},
        "turn_detection": {"type": "server_vad", "prefix_padding_ms": 100}}}})
    assert ga.model == "W" and ga.vad == VadSettings(0.01, 800, 100)
    view = session_view("sess_1", ga)
    assert view["turn_detection"] == {"type": "server_vad", "threshold": 0.01, "silence_duration_ms": 800,
                                      "prefix_padding_ms": 100}


@pytest.mark.parametrize(("session", "param"), [
    ("Whisper", "session"),
    ({"turn_detection": {"threshold": 2}}, "session.turn_detection.threshold"),
    ({"turn_detection": {"silence_duration_ms": "800"}}, "session.turn_detection.silence_duration_ms"),
    ({"turn_detection": {"prefix_padding_ms": -1}}, "session.turn_detection.prefix_padding_ms"),
    ({"turn_detection": {"type": "semantic_vad"}}, "session.turn_detection.type"),
    ({"turn_detection": "on"}, "session.turn_detection"),
    ({"input_audio_format": "g711_ulaw"}, "session.input_audio_format"),
    ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}}, "session.audio.input.format.rate"),
    ({"model": 5}, "session.model"),
    ({"model": None}, "session.model"),
])
def test_session_update_refusals_name_the_field(session, param):
    before = SessionConfig(model="W")
    with pytest.raises(ProtocolError) as err:
        apply_update(before, session)
    assert err.value.param == param and param.split(".")[-1] in err.value.message


def test_containers_are_recognised_from_their_first_bytes():
    assert formats.check(formats.wav_header(3200) + b"\0" * 20) == "wav"
    assert formats.check(b"ID3\x04\0\0\0\0\0\0") == "mp3"
    assert formats.check(bytes([0xFF, 0xFB, 0x90, 0x64])) == "mp3"  # a bare MPEG-1 layer III frame
    assert formats.check(b"fLaC\0\0\0\x22") == "flac"
    assert formats.check(b"OggS\0\x02") == "ogg"
    assert formats.check(b"\x1a\x45\xdf\xa3\x9f\x42\x86\x81") == "webm"
    for head, said in ((b"", "empty"), (b"%PDF-1.7", "PDF"), (b"\0\0\0\x20ftypM4A ", "MP4"),
                       (b"hello world", "no audio container")):
        with pytest.raises(formats.AudioFormatError, match=said):
            formats.check(head)
    damaged = bytearray(formats.wav_header(3200))
    damaged[22:24] = b"\0\0"  # zero channels
    with pytest.raises(formats.AudioFormatError, match="damaged"):
        formats.check(bytes(damaged))
