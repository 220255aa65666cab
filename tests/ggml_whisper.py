"""A Whisper model in whisper.cpp's ggml file format with RANDOM weights, for the whisper.cpp engine.

No PyPI package carries real ggml Whisper weights, so the tests of the whisper.cpp engine path use
this file: the real Whisper **tiny** architecture (multilingual: 51865 tokens, 4+4 layers, 384
wide, 80 mel bins), every tensor under the name and shape whisper.cpp's loader
(`whisper_model_load` in the pinned v1.8.5 sources) expects, a real mel filterbank and a made-up
vocabulary. `whisper-server` loads and runs it like `ggml-tiny.bin`; its transcripts mean nothing
(they are words of the made-up vocabulary, or nothing): it proves the engine path, not quality.

File layout (little-endian): magic "ggml", 11 int32 hparams (the last one the ftype), the mel
filters (n_mel, n_fft, floats), the vocabulary (count, then length-prefixed bytes), then each
tensor as (n_dims, name length, type, dims in ggml order, name, data). ggml orders dimensions
fastest first, so a numpy array of shape (a, b) is written with dims [b, a].

Cached under `LEMONADE_TEST_CACHE/models/tiny-random-whisper-ggml/<key>/` (see `tests/models.py`);
about 75 MB, written in a few seconds.
"""

from __future__ import annotations

import hashlib
import inspect
import struct
from pathlib import Path

import numpy as np

from tests.models import _cached, _digest

FILE_NAME = "ggml-tiny.bin"  # the catalog's Whisper-Tiny checkpoint names this file
GGML_MAGIC = 0x67676D6C
F32, F16 = 0, 1  # ggml type ids
TINY = {"n_vocab": 51865, "n_audio_ctx": 1500, "n_audio_state": 384, "n_audio_head": 6, "n_audio_layer": 4,
        "n_text_ctx": 448, "n_text_state": 384, "n_text_head": 6, "n_text_layer": 4, "n_mels": 80}
N_FFT_BINS = 201  # 1 + 400/2: whisper.cpp asserts it
N_TEXT_TOKENS = 50257  # the multilingual tokenizer's ordinary tokens; the loader adds the special ones


def mel_filters(n_mels: int = 80, n_bins: int = N_FFT_BINS, sample_rate: int = 16000) -> np.ndarray:
    """Triangular mel filters (Slaney-style mel scale, area-normalised) like Whisper's."""
    def hz_to_mel(f: np.ndarray) -> np.ndarray:
        return np.where(f < 1000, f * 3 / 200, 15 + 27 * np.log(np.maximum(f, 1e-9) / 1000) / np.log(6.4))

    def mel_to_hz(m: np.ndarray) -> np.ndarray:
        return np.where(m < 15, m * 200 / 3, 1000 * np.exp((m - 15) * np.log(6.4) / 27))

    freqs = np.linspace(0, sample_rate / 2, n_bins)
    edges = mel_to_hz(np.linspace(hz_to_mel(np.array(0.0)), hz_to_mel(np.array(sample_rate / 2)), n_mels + 2))
    lower = (freqs[None, :] - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None])
    upper = (edges[2:, None] - freqs[None, :]) / (edges[2:, None] - edges[1:-1, None])
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return weights.astype(np.float32)


def vocabulary() -> list[bytes]:
    """Printable single characters at their byte values (whisper.cpp looks up " " by text, as in
    Whisper's byte-level BPE), every other token made up: readable, distinct, plainly not English,
    and never a line break (a transcript's segments stay one line each)."""
    return [bytes([i]) if 32 <= i < 127 else f" tok{i}".encode() for i in range(N_TEXT_TOKENS)]


def tensor_specs(h: dict[str, int]) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, numpy shape, ggml type) of every tensor, in whisper.cpp's names."""
    s, ctx, mels = h["n_audio_state"], h["n_audio_ctx"], h["n_mels"]
    specs: list[tuple[str, tuple[int, ...], int]] = [
        ("encoder.positional_embedding", (ctx, s), F32),
        ("encoder.conv1.weight", (s, mels, 3), F16),
        ("encoder.conv1.bias", (s, 1), F32),
        ("encoder.conv2.weight", (s, s, 3), F16),
        ("encoder.conv2.bias", (s, 1), F32),
        ("encoder.ln_post.weight", (s,), F32),
        ("encoder.ln_post.bias", (s,), F32),
    ]

    def block(prefix: str, cross: bool) -> list[tuple[str, tuple[int, ...], int]]:
        out = [(f"{prefix}.mlp_ln.weight", (s,), F32), (f"{prefix}.mlp_ln.bias", (s,), F32),
               (f"{prefix}.mlp.0.weight", (4 * s, s), F16), (f"{prefix}.mlp.0.bias", (4 * s,), F32),
               (f"{prefix}.mlp.2.weight", (s, 4 * s), F16), (f"{prefix}.mlp.2.bias", (s,), F32)]
        for attn in ("attn", "cross_attn") if cross else ("attn",):
            out += [(f"{prefix}.{attn}_ln.weight", (s,), F32), (f"{prefix}.{attn}_ln.bias", (s,), F32),
                    (f"{prefix}.{attn}.query.weight", (s, s), F16), (f"{prefix}.{attn}.query.bias", (s,), F32),
                    (f"{prefix}.{attn}.key.weight", (s, s), F16),
                    (f"{prefix}.{attn}.value.weight", (s, s), F16), (f"{prefix}.{attn}.value.bias", (s,), F32),
                    (f"{prefix}.{attn}.out.weight", (s, s), F16), (f"{prefix}.{attn}.out.bias", (s,), F32)]
        return out

    for i in range(h["n_audio_layer"]):
        specs += block(f"encoder.blocks.{i}", cross=False)
    t = h["n_text_state"]
    specs += [("decoder.positional_embedding", (h["n_text_ctx"], t), F32),
              ("decoder.token_embedding.weight", (h["n_vocab"], t), F16),
              ("decoder.ln.weight", (t,), F32), ("decoder.ln.bias", (t,), F32)]
    for i in range(h["n_text_layer"]):
        specs += block(f"decoder.blocks.{i}", cross=True)
    return specs


def write_random_whisper(path: Path, hparams: dict[str, int] = TINY, seed: int = 7) -> None:
    """Write the ggml file (f16 matrices, f32 vectors; layer norms 1/0, other weights N(0, 0.02))."""
    rng = np.random.default_rng(seed)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<I", GGML_MAGIC))
        fh.write(struct.pack("<11i", *hparams.values(), F16))
        filters = mel_filters(hparams["n_mels"])
        fh.write(struct.pack("<2i", *filters.shape))
        fh.write(filters.astype("<f4").tobytes())
        tokens = vocabulary()
        fh.write(struct.pack("<i", len(tokens)))
        for token in tokens:
            fh.write(struct.pack("<I", len(token)) + token)
        for name, shape, ggml_type in tensor_specs(hparams):
            if name.endswith(("ln.weight", "ln_post.weight")):
                data = np.ones(shape, dtype=np.float32)
            elif name.endswith(("ln.bias", "ln_post.bias")):
                data = np.zeros(shape, dtype=np.float32)
            else:
                data = rng.normal(0.0, 0.02, size=shape).astype(np.float32)
            encoded = name.encode()
            fh.write(struct.pack("<3i", len(shape), len(encoded), ggml_type))
            fh.write(struct.pack(f"<{len(shape)}i", *reversed(shape)))
            fh.write(encoded)
            fh.write(data.astype("<f2" if ggml_type == F16 else "<f4").tobytes())


def tiny_random_whisper_ggml() -> Path:
    """The cached random-weight tiny model; regenerated whenever this generator changes."""
    source = inspect.getsource(inspect.getmodule(write_random_whisper))  # type: ignore[arg-type]
    key = _digest([b"tiny-random-whisper-ggml-v1", hashlib.sha256(source.encode()).digest(),
                   np.__version__.encode()])
    return _cached("tiny-random-whisper-ggml", key, FILE_NAME, lambda tmp, _folder: write_random_whisper(tmp))
