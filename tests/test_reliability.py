"""Holding up under load, faults and hostile input (the deterministic part of docs/reliability.md).

Real server, real llama-server, real Gemma 3 270M. Figures (timings, fuzz counts) are in the doc;
these tests check outcomes only.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest

from tests.helpers import GEMMA_ID, GEMMA_NAME


@pytest.fixture(scope="module")
def server(gemma_server):
    return gemma_server


def test_64_concurrent_streams_are_complete_and_not_mixed_up(server):
    """64 streams at once to one model: every one ends with [DONE], carries one completion id of its
    own, and its usage matches the chunks it got."""

    async def one(c: httpx.AsyncClient, i: int) -> tuple[set[str], int, dict | None, bool]:
        body = {"model": GEMMA_NAME, "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": f"Count to {i}"}]}
        ids: set[str] = set()
        pieces = 0
        usage = None
        done = False
        async with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                event = json.loads(line[6:])
                ids.add(event["id"])
                usage = event.get("usage") or usage
                pieces += sum(1 for ch in event.get("choices", []) if ch.get("delta", {}).get("content"))
        return ids, pieces, usage, done

    async def run() -> list[tuple[set[str], int, dict | None, bool]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=600,
                                     limits=httpx.Limits(max_connections=100)) as c:
            return await asyncio.gather(*(one(c, i) for i in range(64)))

    results = asyncio.run(run())
    assert all(done for *_, done in results)
    assert all(len(ids) == 1 for ids, *_ in results)
    assert len({next(iter(ids)) for ids, *_ in results}) == 64  # no two clients share a stream
    for _ids, pieces, usage, _done in results:
        assert usage is not None and pieces <= usage["completion_tokens"] <= 6


def test_hostile_input_gets_4xx_naming_the_problem(server):
    """Malformed and adversarial bodies on the main endpoints: a 4xx with a message, never a 5xx."""
    cases = [
        ("/v1/chat/completions", b"{not json"),
        ("/v1/chat/completions", b""),
        ("/v1/chat/completions", json.dumps({"model": GEMMA_NAME, "messages": "hi"}).encode()),
        ("/v1/chat/completions", json.dumps({"model": GEMMA_NAME, "messages": [], "max_tokens": 10**30}).encode()),
        ("/v1/chat/completions", json.dumps({"model": "../../../etc/passwd", "messages": [
            {"role": "user", "content": "x"}]}).encode()),
        ("/v1/chat/completions", json.dumps({"model": "模型\u202e\u0000", "messages": [
            {"role": "user", "content": "x"}]}).encode()),
        ("/v1/completions", json.dumps({"model": GEMMA_NAME, "prompt": 5}).encode()),
        ("/v1/embeddings", json.dumps({"model": GEMMA_NAME, "input": "x"}).encode()),
        ("/v1/load", json.dumps({"model_name": "/etc/passwd"}).encode()),
        ("/v1/load", json.dumps({"model_name": GEMMA_NAME, "ctx_size": "big"}).encode()),
        ("/v1/pull", json.dumps({"model_name": "user.x", "checkpoint": "../../x", "recipe": "llamacpp"}).encode()),
        ("/v1/delete", json.dumps({"model_name": "../" * 20}).encode()),
        ("/v1/audio/transcriptions", b"--x\r\n\r\n--x--"),
        ("/api/chat", json.dumps({"model": GEMMA_NAME, "messages": [{"role": "user", "content": 7}]}).encode()),
        ("/api/generate", json.dumps({"model": "x" * 100000}).encode()),
        # nested deeper than Python's JSON parser recurses (a RecursionError was a 500 on hand-parsed bodies)
        *((path, b'{"model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
          for path in ("/v1/chat/completions", "/api/chat", "/v1/load", "/internal/set", "/v1/messages")),
        ("/v1/chat/completions", b'{"model": "x", "messages": [], "max_tokens": ' + b"9" * 5000 + b"}"),
    ]
    with server.client() as c:
        for path, body in cases:
            resp = c.post(path, content=body, headers={"Content-Type": "application/json"})
            assert 400 <= resp.status_code < 500, (path, body[:80], resp.status_code, resp.text[:200])
            text = resp.text
            assert text and "Traceback" not in text and "/root/" not in text, (path, text[:200])


def test_server_killed_during_config_writes_leaves_valid_state(make_server, gemma_dir):
    """SIGKILL while settings and per-model options are being written: the files parse, hold one of the
    written values, and the server starts again on them."""
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    stop = threading.Event()

    def writer() -> None:
        i = 0
        with httpx.Client(base_url=srv.url, timeout=5) as c:
            while not stop.is_set():
                i += 1
                try:
                    c.post("/internal/set", json={"max_loaded_models": 1 + i % 3})
                    c.post(f"/v1/models/{GEMMA_NAME}/options", json={"ctx_size": 512 + i % 5})
                except httpx.HTTPError:
                    return

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    os.kill(srv.proc.pid, signal.SIGKILL)
    stop.set()
    for t in threads:
        t.join(10)
    srv.proc.wait(10)
    config = json.loads((srv.config_dir / "config.json").read_text())
    assert config["max_loaded_models"] in (1, 2, 3)
    options = json.loads((srv.config_dir / "recipe_options.json").read_text())
    assert options[GEMMA_ID]["ctx_size"] in range(512, 517)
    again = make_server(cache=srv.cache, env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    with again.client() as c:
        assert c.get("/internal/config").json()["max_loaded_models"] == config["max_loaded_models"]


def test_no_engine_outlives_the_server(make_server, gemma_dir):
    """After load, crash, restart and shutdown, the process table holds nothing of ours."""
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    with srv.client() as c:
        c.post("/v1/load", json={"model_name": GEMMA_NAME})
        first = srv.engine_pids()
        os.kill(first[0], signal.SIGKILL)
        assert c.post("/v1/chat/completions", json={"model": GEMMA_NAME, "max_tokens": 2, "messages": [
            {"role": "user", "content": "hi"}]}).status_code == 200
    children = srv.children()
    srv.stop()
    for pid in children:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_huge_bodies_get_413_naming_the_limit(make_server):
    """A body over `max_request_body_mb` is refused with 413 in the route's error shape, whether it
    declares its length or arrives chunked; the limit follows `/internal/set` without a restart."""
    srv = make_server(config={"max_request_body_mb": 1})
    big = b'{"model": "x", "messages": [{"role": "user", "content": "' + b"a" * (3 << 19) + b'"}]}'

    def chunked() -> Iterator[bytes]:
        for i in range(0, len(big), 65536):
            yield big[i:i + 65536]

    with srv.client() as c:
        declared = c.post("/v1/chat/completions", content=big)
        assert declared.status_code == 413, declared.text
        assert declared.json()["error"]["code"] == "request_too_large"
        assert "max_request_body_mb" in declared.json()["error"]["message"]
        streamed = c.post("/v1/chat/completions", content=chunked())
        assert streamed.status_code == 413 and "1 MB" in streamed.json()["error"]["message"], streamed.text
        ollama = c.post("/api/chat", content=chunked())
        assert ollama.status_code == 413 and "max_request_body_mb" in ollama.json()["error"]
        small = c.post("/v1/chat/completions", content=big[: 1 << 19] + b'"}]}')
        assert small.status_code == 404  # under the limit: read, and refused for its unknown model only
        assert c.post("/internal/set", json={"max_request_body_mb": 4}).status_code == 200
        assert c.post("/v1/chat/completions", content=chunked()).status_code == 404
        bad = c.post("/internal/set", json={"max_request_body_mb": 0})
        assert bad.status_code == 400 and "max_request_body_mb" in bad.json()["error"]["message"]


def test_openapi_documents_the_errors_the_server_sends(server):
    """`/openapi.json` promises what the server answers (the fuzzer's schema checks rely on it): no
    FastAPI 422 that is never sent, each family's error shape as every operation's `default`, and the
    bodies of the routes that parse their JSON by hand (Ollama's)."""
    with server.client() as c:
        doc = c.get("/openapi.json").json()
        shapes = {"/v1/models/{model_id}": "Error", "/api/show": "OllamaError", "/v1/messages": "AnthropicError"}
        for path, item in doc["paths"].items():
            for method, op in item.items():
                assert "422" not in op["responses"], (method, path)
                error = op["responses"]["default"]["content"]["application/json"]["schema"]
                # /v1/pull may also answer the documented {"error": "..."} of a refused definition
                refs = [s["$ref"] for s in error.get("anyOf", [error])]
                assert all(r.startswith("#/components/schemas/") for r in refs), (method, path)
        for path, shape in shapes.items():
            op = next(iter(doc["paths"][path].values()))
            assert op["responses"]["default"]["content"]["application/json"]["schema"]["$ref"].endswith(shape)
        chat = doc["paths"]["/api/chat"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert {"model", "messages"} <= set(chat["properties"])
        for path, media in (("/v1/chat/completions", "text/event-stream"), ("/api/chat", "application/x-ndjson")):
            assert media in doc["paths"][path]["post"]["responses"]["200"]["content"]  # what "stream": true gets
        ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
        assert len(ids) == len(set(ids))  # HEAD and GET of one route used to share one
        refs = {m for m in json.dumps(doc).split('"') if m.startswith("#/components/schemas/")}
        assert {r.rsplit("/", 1)[1] for r in refs} <= set(doc["components"]["schemas"])  # nothing dangling
        # and what the server sends for an error has that shape
        err = c.get("/v1/models/nope").json()
        assert set(doc["components"]["schemas"]["Error"]["required"]) <= set(err)
        assert isinstance(c.post("/api/show", json={}).json()["error"], str)
        assert c.head("/live").headers["content-type"] == "application/json"
        assert doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"].keys() == {"text/plain"}
