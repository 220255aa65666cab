"""Which audio container a file is, from its first bytes; WAV framing for raw PCM16.

Why sniff: an upload that is no audio file at all (a PDF, random bytes, an empty part) must be a
400 that costs nothing, not a model load followed by a decoder error. The engine still decodes the
file for real (PyAV in the faster-whisper worker) and says so when a file of a known container
turns out to be damaged.
"""

from __future__ import annotations

import struct

# What the transcription endpoint accepts: the spec's WAV plus the containers every browser and phone
# records in. Each is decoded by the engine and resampled to 16 kHz mono.
FORMATS = ("wav", "mp3", "flac", "ogg", "webm")
HEAD_BYTES = 64  # enough for every signature below, and for a WAV's RIFF header and fmt chunk


class AudioFormatError(ValueError):
    """A file that is not audio of a supported format; the message says what it looks like."""


def _mp3_frame(head: bytes) -> bool:
    """An MPEG-1/2 layer III frame header (an mp3 without an ID3 tag starts with one)."""
    if len(head) < 4 or head[0] != 0xFF or (head[1] & 0xE0) != 0xE0:
        return False
    version, layer = (head[1] >> 3) & 0x3, (head[1] >> 1) & 0x3
    bitrate, rate = head[2] >> 4, (head[2] >> 2) & 0x3
    return version != 1 and layer == 1 and bitrate not in (0, 15) and rate != 3


def sniff(head: bytes) -> str | None:
    """The container of a file whose first bytes are `head`, or None when it is none we accept."""
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:3] == b"ID3" or _mp3_frame(head):
        return "mp3"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:4] == b"\x1a\x45\xdf\xa3":  # EBML: Matroska or WebM, both decoded alike
        return "webm"
    return None


def _describe(head: bytes) -> str:
    """A short guess at what a refused file is, for the error message."""
    known = {b"%PDF": "a PDF document", b"\x89PNG": "a PNG image", b"\xff\xd8\xff": "a JPEG image",
             b"PK\x03\x04": "a ZIP archive", b"GGUF": "a GGUF model file"}
    for magic, what in known.items():
        if head.startswith(magic):
            return what
    if head[4:8] == b"ftyp":
        return "an MP4/M4A file (not supported yet; convert it to wav, mp3, flac, ogg or webm)"
    if head.lstrip()[:1] in (b"{", b"["):
        return "JSON text"
    return "no audio container we know"


def _check_wav(head: bytes) -> None:
    """The fmt chunk of a WAV that starts with it (nearly all do): channels and rate must be sane."""
    if head[12:16] != b"fmt " or len(head) < 36:
        return  # another chunk first: left to the decoder
    fmt_tag, channels, rate = struct.unpack("<HHI", head[20:28])
    bits = struct.unpack("<H", head[34:36])[0]
    if channels == 0 or rate == 0 or bits == 0:
        raise AudioFormatError(f"the WAV header is damaged ({channels} channels, {rate} Hz, {bits} bits)")
    if fmt_tag not in (1, 3, 6, 7, 0xFFFE):  # PCM, float, A-law, mu-law, extensible
        raise AudioFormatError(f"the WAV file uses codec 0x{fmt_tag:04x}, which is not supported; use PCM")


def check(head: bytes) -> str:
    """The container of a file starting with `head`, or AudioFormatError saying why it is refused."""
    if not head:
        raise AudioFormatError("the file is empty")
    kind = sniff(head)
    if kind is None:
        raise AudioFormatError(f"it is not an audio file of a supported format (it looks like {_describe(head)}). "
                               f"Supported: {', '.join(FORMATS)}")
    if kind == "wav":
        _check_wav(head)
    return kind


def wav_header(pcm_bytes: int, rate: int = 16000, channels: int = 1) -> bytes:
    """A 44-byte header that makes `pcm_bytes` of little-endian PCM16 a WAV file."""
    block = 2 * channels
    return (b"RIFF" + struct.pack("<I", 36 + pcm_bytes) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, rate, rate * block, block, 16)
            + b"data" + struct.pack("<I", pcm_bytes))
