"""Embeddings and rerank end to end: the real server, real `llama-server` engines, real GGUF files.

- Embeddings use all-MiniLM-L6-v2 converted to GGUF by llama.cpp's converter (tests/models.py), a
  real embedding model, so besides shapes we check meaning: a paraphrase is closer than an
  unrelated sentence.
- Rerank uses a tiny reranker with RANDOM weights (tests/models.py): its scores mean nothing, so
  only the code path is tested (routing, input order, indices, top_n, usage, errors), never the
  ranking.

Both sit in the extra models dir, so they are listed by folder name (`extra.<folder>` canonically)
with the deployment mode read from their GGUF headers; callers are the official `openai` client and raw `httpx`.
"""

from __future__ import annotations

import asyncio
import base64
import math
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.helpers import GEMMA_NAME, Server, ServerFactory
from tests.models import minilm_gguf, minilm_source_dir, reranker_token_id, tiny_reranker_gguf

EMBED = "all-MiniLM-L6-v2"
RERANK = "tiny-random-reranker"
RERANK_PATHS = ("/v1/rerank", "/v1/reranking", "/v1/reranker", "/api/v1/rerank")

QUERY = "what is the capital of france?"
DOCS = ["paris is the capital of france.", "berlin is the capital of germany.", "a cat sat on the mat.",
        "hello world", "madrid is the capital of spain."]


@pytest.fixture(scope="module")
def extra_dir(tmp_path_factory: pytest.TempPathFactory, gemma_dir: Path) -> Path:
    """One folder per model (so the names are the folder names), plus Gemma at the root as a chat model."""
    root = tmp_path_factory.mktemp("extra-models")
    for folder, path in (("all-MiniLM-L6-v2", minilm_gguf()), ("tiny-random-reranker", tiny_reranker_gguf())):
        (root / folder).mkdir()
        (root / folder / path.name).symlink_to(path)
    gemma = next(gemma_dir.glob("*.gguf"))
    (root / gemma.name).symlink_to(gemma)
    return root


@pytest.fixture(scope="module")
def server(module_servers: ServerFactory, extra_dir: Path) -> Server:
    # The limit is per model type, so 1 keeps one embedding and one reranking model loaded together.
    return module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(extra_dir)}, config={"max_loaded_models": 1})


@pytest.fixture(scope="module")
def oai(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def cosine(a: list[float], b: list[float]) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def decode_b64(data: str) -> list[float]:
    return np.frombuffer(base64.b64decode(data), dtype="<f4").astype(np.float64).tolist()


def assert_error(resp: httpx.Response, status: int, code: str | None = None, mentions: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    if code is not None:
        assert err["code"] == code, err
    if mentions is not None:
        assert mentions in err["message"], err
    return err


# --- listing -----------------------------------------------------------------------------------------


def test_models_listed_with_mode_labels(server: Server, oai: openai.OpenAI) -> None:
    ids = {m.id for m in oai.models.list()}
    assert {EMBED, RERANK, GEMMA_NAME} <= ids
    with server.client() as http:
        data = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        assert data[EMBED]["labels"] == ["custom", "embeddings"]
        assert data[RERANK]["labels"] == ["custom", "reranking"]
        assert "embeddings" not in data[GEMMA_NAME]["labels"] and "reranking" not in data[GEMMA_NAME]["labels"]
        for name in (EMBED, RERANK):
            assert data[name]["recipe"] == "llamacpp"
            assert data[name]["downloaded"] is True
        assert data[EMBED]["max_context_window"] == 512  # read from the GGUF header


# --- embeddings ----------------------------------------------------------------------------------------


def test_embedding_of_one_string(oai: openai.OpenAI) -> None:
    resp = oai.embeddings.create(model=EMBED, input="The quick brown fox jumps over the lazy dog.",
                                 encoding_format="float")
    assert resp.object == "list"
    assert len(resp.data) == 1
    item = resp.data[0]
    assert item.index == 0 and item.object == "embedding"
    assert len(item.embedding) == 384  # MiniLM-L6's hidden size
    assert all(isinstance(v, float) and math.isfinite(v) for v in item.embedding)
    assert math.isclose(float(np.linalg.norm(item.embedding)), 1.0, abs_tol=1e-3)  # llama-server normalises
    assert resp.usage.prompt_tokens > 0


def test_embeddings_of_a_list_carry_meaning(oai: openai.OpenAI) -> None:
    sentences = ["The cat sits on the mat.", "A kitten is resting on the rug.",
                 "Stock markets fell sharply on Monday.", "Shares dropped steeply at the start of the week."]
    resp = oai.embeddings.create(model=EMBED, input=sentences, encoding_format="float")
    assert [d.index for d in resp.data] == [0, 1, 2, 3]
    cat, kitten, stocks, shares = (d.embedding for d in resp.data)
    # Paraphrases are closer than unrelated sentences, in both pairs.
    assert cosine(cat, kitten) > cosine(cat, stocks) + 0.2
    assert cosine(cat, kitten) > cosine(cat, shares) + 0.2
    assert cosine(stocks, shares) > cosine(stocks, kitten) + 0.2
    # The same text in a batch and alone gives the same vector.
    alone = oai.embeddings.create(model=EMBED, input=sentences[2], encoding_format="float").data[0].embedding
    assert cosine(alone, stocks) > 0.999


def test_base64_embeddings_decode_to_the_floats(oai: openai.OpenAI) -> None:
    texts = ["Paris is the capital of France.", "I like green tea."]
    floats = oai.embeddings.create(model=EMBED, input=texts, encoding_format="float").data
    b64 = oai.embeddings.create(model=EMBED, input=texts, encoding_format="base64").data
    assert len(b64) == 2
    for f, b in zip(floats, b64, strict=True):
        assert isinstance(b.embedding, str)  # asked explicitly: the client hands back the raw string
        decoded = decode_b64(b.embedding)
        assert len(decoded) == len(f.embedding) == 384
        assert np.allclose(decoded, f.embedding, atol=1e-5)
    # Without encoding_format the client asks for base64 itself and decodes it to floats.
    default = oai.embeddings.create(model=EMBED, input=texts).data
    for f, d in zip(floats, default, strict=True):
        assert np.allclose(d.embedding, f.embedding, atol=1e-5)


def test_async_client_concurrent_embeddings(server: Server) -> None:
    async def run() -> list[list[float]]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        async with client:
            results = await asyncio.gather(*(client.embeddings.create(model=EMBED, input=t, encoding_format="float")
                                             for t in ("good morning", "good evening", "quarterly tax report")))
        return [r.data[0].embedding for r in results]

    morning, evening, tax = asyncio.run(run())
    assert cosine(morning, evening) > cosine(morning, tax)


def test_embeddings_bad_inputs(server: Server, oai: openai.OpenAI) -> None:
    with server.client() as http:
        assert_error(http.post("/v1/embeddings", json={"model": EMBED}), 400, "missing_argument", "input")
        assert_error(http.post("/v1/embeddings", json={"input": "x"}), 400, "missing_argument", "model")
        assert_error(http.post("/v1/embeddings", json={"model": EMBED, "input": []}), 400, "invalid_argument")
        assert_error(http.post("/v1/embeddings", json={"model": EMBED, "input": "x", "encoding_format": "hex"}),
                     400, "invalid_argument", "encoding_format")
        assert_error(http.post("/v1/embeddings", content=b"{not json", headers={"content-type": "application/json"}),
                     400, "invalid_json")
    with pytest.raises(openai.NotFoundError) as exc:
        oai.embeddings.create(model="no-such-model-xyz", input="x")
    assert exc.value.code == "model_not_found"


def test_wrong_mode_is_refused(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as chat_on_embedder:
        oai.chat.completions.create(model=EMBED, messages=[{"role": "user", "content": "hi"}])
    assert "embeddings" in str(chat_on_embedder.value)
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model=RERANK, prompt="hi")
    with pytest.raises(openai.BadRequestError) as embed_on_chat:
        oai.embeddings.create(model=GEMMA_NAME, input="hi")
    assert "chat" in str(embed_on_chat.value)
    with pytest.raises(openai.BadRequestError):
        oai.embeddings.create(model=RERANK, input="hi")


# --- rerank --------------------------------------------------------------------------------------------


def check_rerank_body(body: dict, model: str, n_docs: int, n_results: int | None = None) -> dict[int, float]:
    """Results come in input order (api-llamacpp.md: clients index them by position)."""
    assert body["model"] == model
    assert body["object"] == "list"
    results = body["results"]
    assert len(results) == (n_docs if n_results is None else n_results)
    indices = [r["index"] for r in results]
    assert len(set(indices)) == len(indices) and all(0 <= i < n_docs for i in indices)
    assert indices == sorted(indices)
    if n_results is None:
        assert indices == list(range(n_docs))
    scores = [r["relevance_score"] for r in results]
    assert all(isinstance(s, float) and math.isfinite(s) for s in scores)
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and usage["total_tokens"] >= usage["prompt_tokens"]
    return dict(zip(indices, scores, strict=True))


def test_rerank_on_every_path(server: Server) -> None:
    seen: list[dict[int, float]] = []
    with server.client() as http:
        for path in RERANK_PATHS:
            resp = http.post(path, json={"model": RERANK, "query": QUERY, "documents": DOCS})
            assert resp.status_code == 200, (path, resp.text)
            seen.append(check_rerank_body(resp.json(), RERANK, len(DOCS)))
    # Every path reaches the same engine: same scores (random weights, but deterministic).
    for scores in seen[1:]:
        assert scores.keys() == seen[0].keys()
        for i, s in scores.items():
            assert math.isclose(s, seen[0][i], rel_tol=1e-4, abs_tol=1e-4)
    assert len(set(seen[0].values())) > 1  # the scores do differ between documents
    scores = list(seen[0].values())
    assert scores != sorted(scores, reverse=True)  # llama-server's own (score) order would show


def test_rerank_top_n_and_single_document(server: Server) -> None:
    with server.client() as http:
        full = check_rerank_body(http.post("/v1/rerank", json={"model": RERANK, "query": QUERY,
                                                                "documents": DOCS}).json(), RERANK, len(DOCS))
        top = http.post("/v1/rerank", json={"model": RERANK, "query": QUERY, "documents": DOCS, "top_n": 2})
        assert top.status_code == 200, top.text
        best_two = check_rerank_body(top.json(), RERANK, len(DOCS), n_results=2)
        # the two best-scored documents, still in input order
        assert list(best_two) == sorted(sorted(full, key=full.__getitem__, reverse=True)[:2])
        assert all(math.isclose(best_two[i], full[i], rel_tol=1e-4, abs_tol=1e-4) for i in best_two)
        one = http.post("/v1/rerank", json={"model": RERANK, "query": QUERY, "documents": ["hello world"]})
        assert one.status_code == 200, one.text
        assert list(check_rerank_body(one.json(), RERANK, 1)) == [0]


def test_rerank_error_table(server: Server) -> None:
    ok = {"model": RERANK, "query": QUERY, "documents": DOCS}
    with server.client() as http:
        def post(body: object = None, content: bytes | None = None) -> httpx.Response:
            if content is not None:
                return http.post("/v1/rerank", content=content, headers={"content-type": "application/json"})
            return http.post("/v1/rerank", json=body)

        # invalid_json: not JSON at all, or JSON that is not an object
        assert_error(post(content=b'{"model": '), 400, "invalid_json")
        assert_error(post(body=["not", "an", "object"]), 400, "invalid_json")
        # missing_argument, naming the field
        for field in ("model", "query", "documents"):
            body = {k: v for k, v in ok.items() if k != field}
            assert_error(post(body), 400, "missing_argument", field)
        # invalid_argument: wrong JSON types, nested values, out-of-range values
        assert_error(post({**ok, "documents": "one string"}), 400, "invalid_argument", "documents")
        assert_error(post({**ok, "documents": ["fine", 42]}), 400, "invalid_argument", "documents")
        assert_error(post({**ok, "documents": []}), 400, "invalid_argument", "documents")
        assert_error(post({**ok, "query": 7}), 400, "invalid_argument", "query")
        assert_error(post({**ok, "top_n": 0}), 400, "invalid_argument", "top_n")
        assert_error(post({**ok, "ctx_size": -5}), 400, "invalid_argument", "ctx_size")
        # a model that is not a reranker, and one that is not a llama.cpp model
        assert_error(post({**ok, "model": EMBED}), 400, mentions=EMBED)
        assert_error(post({**ok, "model": GEMMA_NAME}), 400, mentions=GEMMA_NAME)
        assert_error(post({**ok, "model": "Whisper-Tiny"}), 400, "model_mode_mismatch", "Whisper-Tiny")
        # unknown model
        assert_error(post({**ok, "model": "no-such-reranker"}), 404, "model_not_found")
        # after all that, the endpoint still works
        assert post(ok).status_code == 200


def test_engine_errors_are_relayed_and_the_engines_survive(server: Server, oai: openai.OpenAI) -> None:
    """Inputs longer than the engine's batch (512 tokens): llama-server refuses them with an error."""
    too_long = "paris " * 700
    with server.client() as http:
        assert http.post("/v1/rerank", json={"model": RERANK, "query": "q", "documents": ["d"]}).status_code == 200
        oai.embeddings.create(model=EMBED, input="warm up", encoding_format="float")
        pids = sorted(server.engine_pids())
        err = assert_error(http.post("/v1/rerank", json={"model": RERANK, "query": QUERY, "documents": [too_long]}),
                           500, "backend_error", RERANK)
        assert "too large" in err["message"]  # the engine's own words reach the client
        with pytest.raises(openai.InternalServerError) as exc:
            oai.embeddings.create(model=EMBED, input=["short", too_long], encoding_format="float")
        assert EMBED in str(exc.value)
        # Both engines are still the same processes and still answer.
        assert http.post("/v1/rerank", json={"model": RERANK, "query": QUERY, "documents": DOCS}).status_code == 200
        assert len(oai.embeddings.create(model=EMBED, input="fine", encoding_format="float").data) == 1
        assert sorted(server.engine_pids()) == pids


# --- tokenize follows the most recently used model -----------------------------------------------------


def minilm_ids(*words: str) -> list[int]:
    """Token ids from the original Hugging Face vocab.txt (id = line number): an independent reference."""
    vocab = (minilm_source_dir() / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return [vocab.index(w) for w in words]


def test_tokenize_after_rerank_uses_the_rerankers_tokenizer(server: Server, oai: openai.OpenAI) -> None:
    reranker_ids = [reranker_token_id("paris"), reranker_token_id("hello")]
    minilm = minilm_ids("paris", "hello")
    assert reranker_ids != minilm
    with server.client() as http:
        rerank = http.post("/v1/rerank", json={"model": RERANK, "query": "paris", "documents": ["hello"]})
        assert rerank.status_code == 200, rerank.text
        resp = http.post("/v1/tokenize", json={"content": "Paris hello"})
        assert resp.status_code == 200, resp.text
        assert resp.json()["tokens"] == reranker_ids

        oai.embeddings.create(model=EMBED, input="anything", encoding_format="float")
        assert http.post("/v1/tokenize", json={"content": "Paris hello"}).json()["tokens"] == minilm

        # Naming the model picks its tokenizer whatever ran last.
        named = http.post("/v1/tokenize", json={"content": "Paris hello", "model": RERANK, "with_pieces": True})
        assert named.status_code == 200, named.text
        assert [t["id"] for t in named.json()["tokens"]] == reranker_ids


def test_both_types_stay_loaded_under_a_limit_of_one(server: Server, oai: openai.OpenAI) -> None:
    oai.embeddings.create(model=EMBED, input="warm", encoding_format="float")
    with server.client() as http:
        assert http.post("/v1/rerank", json={"model": RERANK, "query": "a", "documents": ["b"]}).status_code == 200
        health = http.get("/v1/health").json()
    loaded = {m["model_name"]: m for m in health["all_models_loaded"]}
    assert loaded[EMBED]["type"] == "embedding"
    assert loaded[RERANK]["type"] == "reranking"
    assert health["model_loaded"] == RERANK  # the most recently used one
    assert len(server.engine_pids()) >= 2
