"""The context a request really gets, with the configuration a user gets (issue 29).

Unit level: how big a model's KV cache is per token (from its GGUF metadata, the way llama.cpp lays
the cache out) and what `ctx_size: -1` chooses for a given amount of free memory. End to end, with
the real Gemma 3 270M and the shipped defaults (auto-tune and its profile for this machine): the
context every API states is the one llama-server reports; eight long prompts sent at once all answer
(the profile's slots share one KV cache, runtime/kv_pool.py). That a prompt of 3/4 of an automatic
context answers is proven where memory sizes that context: tests/test_memory.py, in a memory-capped
host.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from lemonade.backends.llamacpp.context import (
    CTX_ALIGN,
    FALLBACK_CTX,
    MIN_AUTO_CTX,
    GiB,
    auto_context,
    kv_layout,
)
from tests.gguf_factory import write_gguf
from tests.helpers import GEMMA_NAME

MiB = 1 << 20


# ----- the KV cache's size, from GGUF metadata -------------------------------------------------------

def test_grouped_query_attention_layout(tmp_path: Path) -> None:
    """A Llama-style model: every layer caches K and V of its KV heads, f16 (2 bytes) by default."""
    path = write_gguf(tmp_path / "m.gguf", "llama", context_length=131072,
                      meta={"block_count": 32, "embedding_length": 4096, "attention.head_count": 32,
                            "attention.head_count_kv": 8})
    layout = kv_layout(path)
    assert layout is not None and layout.trained == 131072 and layout.fixed == 0
    assert layout.per_token == 32 * 8 * (128 + 128) * 2  # 128 = 4096 / 32 heads
    quantised = kv_layout(path, "-ctk q8_0 --cache-type-v q8_0")
    assert quantised is not None and quantised.per_token == pytest.approx(32 * 8 * 256 * 34 / 32)


def test_sliding_window_layers_do_not_grow_with_the_context(tmp_path: Path) -> None:
    """Gemma 3's layout (llama.cpp: five sliding-window layers, then a full one): only the full layers'
    cache grows; the others keep a window per slot."""
    meta = {"block_count": 18, "embedding_length": 640, "attention.head_count": 4, "attention.head_count_kv": 1,
            "attention.key_length": 256, "attention.value_length": 256, "attention.sliding_window": 512}
    layout = kv_layout(write_gguf(tmp_path / "g.gguf", "gemma3", context_length=32768, meta=meta), parallel=8)
    assert layout is not None
    assert layout.per_token == 3 * 1 * 512 * 2  # layers 5, 11, 17
    assert layout.fixed == 15 * 1 * 512 * 2 * (512 * 8 + 512)
    # The GGUF's own pattern wins over the architecture's default; an unknown layout counts every layer.
    explicit = kv_layout(write_gguf(tmp_path / "p.gguf", "gemma3", meta={**meta, "attention.sliding_window_pattern":
                                                                         [True, False] * 9}))
    assert explicit is not None and explicit.per_token == 9 * 512 * 2
    unknown = kv_layout(write_gguf(tmp_path / "u.gguf", "newarch", meta=meta))
    assert unknown is not None and unknown.per_token == 18 * 512 * 2 and unknown.fixed == 0


def test_hybrid_and_latent_attention_layouts(tmp_path: Path) -> None:
    hybrid = kv_layout(write_gguf(tmp_path / "h.gguf", "qwen3next", meta={
        "block_count": 48, "embedding_length": 2048, "attention.head_count": 16, "attention.head_count_kv": 2,
        "attention.key_length": 256, "attention.value_length": 256, "full_attention_interval": 4}))
    assert hybrid is not None and hybrid.per_token == 12 * 2 * 512 * 2  # one attention layer in four
    mla = kv_layout(write_gguf(tmp_path / "d.gguf", "deepseek2", meta={
        "block_count": 27, "embedding_length": 2048, "attention.head_count": 16, "attention.head_count_kv": 1,
        "attention.kv_lora_rank": 512, "rope.dimension_count": 64}))
    assert mla is not None and mla.per_token == 27 * (512 + 64) * 2  # one compressed row per layer


# ----- ctx_size -1: the largest context whose whole estimate fits, up to the trained length ----------

def _model(tmp_path: Path, trained: int = 131072) -> tuple[Path, dict[str, list[Path]]]:
    path = write_gguf(tmp_path / "m.gguf", "llama", context_length=trained,
                      meta={"block_count": 32, "embedding_length": 4096, "attention.head_count": 32,
                            "attention.head_count_kv": 8})  # 128 KiB per token of KV cache
    return path, {"main": [path]}


def _need(files: dict[str, list[Path]], args: str = "-np 1"):
    from lemonade.backends.llamacpp.memory import memory_need

    return memory_need(files, {"ctx_size": -1, "llamacpp_args": args}, "cpu", 64 * GiB)


def test_auto_context_is_the_trained_length_when_memory_allows(tmp_path: Path) -> None:
    main, files = _model(tmp_path, trained=8192)
    choice = auto_context(_need(files), free=64 * GiB)
    assert choice.ctx_size == 8192
    assert "trained length (8192 tokens)" in choice.reason and "GiB of memory free" in choice.reason


def test_auto_context_shrinks_to_the_free_memory(tmp_path: Path) -> None:
    main, files = _model(tmp_path)
    need = _need(files)
    free = need.at(28672)  # exactly what 28672 tokens take, with the prompt cache and buffers they bring
    choice = auto_context(need, free=free)
    assert choice.ctx_size == 28672 and choice.ctx_size % CTX_ALIGN == 0
    assert "the most that fits below the trained length (131072 tokens)" in choice.reason
    # What a heavier machine load leaves: the smallest useful context, said not to fit.
    tight = auto_context(need, free=need.at(MIN_AUTO_CTX) - 1)
    assert tight.ctx_size == MIN_AUTO_CTX and "does not fit" in tight.reason


def test_auto_context_without_metadata_or_memory_figures(tmp_path: Path) -> None:
    bare = write_gguf(tmp_path / "b.gguf", "llama")  # no layer counts: a context, but no KV layout
    assert auto_context(None, free=64 * GiB).ctx_size == FALLBACK_CTX
    main, files = _model(tmp_path)
    assert auto_context(_need(files), free=None).ctx_size == FALLBACK_CTX
    assert _need({"main": [bare]}).ctx == 2048  # its trained length, from the header


# ----- end to end: the defaults a user gets ---------------------------------------------------------

def _words(n: int) -> str:
    """Varied English-like text (repetition would let a model loop); about one token per word."""
    vocab = ("lemon tree garden river stone cloud market window yellow quiet morning story bridge "
             "paper candle winter orange harbor valley music").split()
    return " ".join(vocab[(i * 7 + i // 20) % len(vocab)] for i in range(n))


def _tokens(server, text: str) -> int:
    with server.client() as c:
        resp = c.post("/api/v1/tokenize", json={"model": GEMMA_NAME, "content": text})
        assert resp.status_code == 200, resp.text
        return len(resp.json()["tokens"])


def _prompt_of(server, tokens: int) -> str:
    """A user message of about `tokens` tokens (measured with the model's own tokenizer)."""
    per_word = _tokens(server, _words(1000)) / 1000
    return _words(int(tokens / per_word))


@pytest.fixture(scope="module")
def loaded(gemma_server):
    with gemma_server.client() as c:
        resp = c.post("/v1/load", json={"model_name": GEMMA_NAME})
        assert resp.status_code == 200, resp.text
        answer = resp.json()
        (entry,) = c.get("/v1/health").json()["all_models_loaded"]
        props = httpx.get(entry["backend_url"].removesuffix("/v1") + "/props", timeout=30).json()
    return answer, entry, props


def test_every_api_states_the_engines_context(gemma_server, loaded) -> None:
    answer, entry, props = loaded
    engine = props["default_generation_settings"]["n_ctx"]  # tokens one request may use, per llama-server
    assert engine == answer["context_length"] == entry["context_length"]
    assert "automatic" in answer["context_reason"]  # ctx_size -1, the default, sized to the free memory
    assert engine >= 8192  # Gemma 3 270M was trained on 32768; this machine has room for much more than 8192
    with gemma_server.client() as c:
        listed = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
        assert listed[GEMMA_NAME]["context_length"] == engine
        assert c.get(f"/v1/models/{GEMMA_NAME}").json()["context_length"] == engine
        show = c.post("/api/show", json={"model": GEMMA_NAME}).json()
        assert show["parameters"] == f"num_ctx {engine}"  # model_info keeps the file's trained length
        assert c.get("/api/ps").json()["models"][0]["context_length"] == engine
        options = c.get(f"/v1/models/{GEMMA_NAME}/options").json()
        assert options["resolved_ctx_size"] == engine
    status = subprocess.run([sys.executable, "-m", "lemonade.cli.main", "status", "--port",
                             str(gemma_server.port)], capture_output=True, text=True, timeout=120,
                            env={"PATH": "/usr/bin:/bin", "COLUMNS": "250", "HOME": str(gemma_server.cache)})
    assert status.returncode == 0, status.stderr
    assert str(engine) in status.stdout


def test_the_engine_reads_a_prompt_one_ubatch_at_a_time(gemma_server, loaded) -> None:
    """A prompt of about 1,500 tokens takes llama-server at least one decode step per 512 of them (its
    own count, `llamacpp:n_decode_total`): a batch is one ubatch, not llama-server's default 2,048 tokens,
    so a stream beside a long prompt waits for one ubatch at most (backends/llamacpp/engine.py batch_args)."""
    _, entry, _ = loaded
    engine = entry["backend_url"].removesuffix("/v1")

    def decodes() -> int:
        lines = httpx.get(engine + "/metrics", timeout=30).text.splitlines()
        (value,) = [line.split()[1] for line in lines if line.startswith("llamacpp:n_decode_total ")]
        return int(float(value))

    before = decodes()
    with gemma_server.client() as c:
        resp = c.post("/v1/completions", json={"model": GEMMA_NAME, "max_tokens": 1,
                                               "prompt": "A new text. " + _prompt_of(gemma_server, 1500)})
        assert resp.status_code == 200, resp.text
    read = resp.json()["timings"]["prompt_n"]
    assert read > 1024 and decodes() - before >= -(-read // 512)


def test_eight_concurrent_long_prompts_all_answer(gemma_server, loaded) -> None:
    """Eight prompts that each need more than an eighth of the context (so the profile's eight slots,
    had they divided it, would each refuse one), sent at once. Together they need more than the
    shared KV cache holds: the server admits them as room frees up instead of letting the engine fail
    them all ("Context size has been exceeded"). ctx_size 2048 instead of the automatic size only
    keeps the CPU time modest (8 x 384 tokens); the profile and everything else are the defaults."""
    with gemma_server.client() as c:
        resp = c.post("/v1/load", json={"model_name": GEMMA_NAME, "ctx_size": 2048})
        assert resp.status_code == 200, resp.text
        context = resp.json()["context_length"]
    each = context // 8 + context // 16
    # each begins with its own question: prompts sharing a beginning would wait for the first one to
    # read it and copy its slot (runtime/slot_affinity.py), and not be sent together
    prompts = [f"Question {i}: name a fruit.\n" + _prompt_of(gemma_server, each) for i in range(8)]

    async def ask(client: httpx.AsyncClient, prompt: str) -> httpx.Response:
        return await client.post("/v1/chat/completions", json={
            "model": GEMMA_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": prompt}]})

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=gemma_server.url, timeout=1800) as client:
            return await asyncio.gather(*(ask(client, p) for p in prompts))

    answers = asyncio.run(main())
    assert [r.status_code for r in answers] == [200] * 8, [r.text[:200] for r in answers if r.status_code != 200]
    assert all(r.json()["usage"]["prompt_tokens"] > context // 8 for r in answers)
    with gemma_server.client() as c:
        (entry,) = c.get("/v1/health").json()["all_models_loaded"]
    kv = entry["kv_cache"]
    assert kv["tokens"] == context and kv["slots"] > 1 and kv["reserved"] == 0 and kv["waits_total"] > 0
