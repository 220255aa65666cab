"""The whole app in-process through ASGI (no socket, no server process), its engine the stand-in.

What this layer proves quickly: a request's way through the guard, the route, the router and the
proxy, with the official OpenAI client, and what the answers and `/v1/health` say when the engine
misbehaves. Each behaviour here keeps its end-to-end test on the real engine (test_serving.py).
"""

from __future__ import annotations

import asyncio

import httpx
import openai

from tests.unit.standin_world import MODEL, app_client, run


def test_chat_through_the_official_client_is_relayed_and_counted(tmp_path):
    async def scenario() -> tuple[str, str, dict]:
        async with app_client(tmp_path) as (http, services, engine):
            client = openai.AsyncOpenAI(base_url="http://127.0.0.1/api/v1", api_key="x", http_client=http)
            answer = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "one two three"}], max_tokens=3)
            chunks = [c async for c in await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "one two three"},
                                       {"role": "assistant", "content": "tok0 tok1 tok2"},
                                       {"role": "user", "content": "four"}], max_tokens=2, stream=True)]
            streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            stats = (await http.get("/api/v1/stats")).json()
            return answer.choices[0].message.content, streamed, stats

    content, streamed, stats = run(scenario)
    assert content == "tok0 tok1 tok2" and streamed == "tok0 tok1"
    # the second turn goes back to the first one's slot, which has its three words cached (llama.cpp's cache_n)
    assert stats["output_tokens"] == 2 and stats["cache_tokens"] == 3


def test_an_engine_that_dies_mid_request_is_reported_and_restarted(tmp_path):
    async def scenario() -> tuple[int, dict, str]:
        async with app_client(tmp_path) as (http, services, engine):
            bad = await http.post("/api/v1/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": "STANDIN:crash"}]})
            for _ in range(100):  # the exit is noticed when the engine's output ends
                health = (await http.get("/api/v1/health")).json()
                if health["crashed_models"]:
                    break
                await asyncio.sleep(0.05)
            good = await http.post("/api/v1/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 1})
            return bad.status_code, health, good.json()["choices"][0]["message"]["content"]

    status, health, content = run(scenario)
    assert status >= 500
    assert [c["model_name"] for c in health["crashed_models"]] == [MODEL]
    assert content == "tok0"


def test_bad_input_is_refused_before_any_engine_starts(tmp_path):
    async def scenario() -> tuple[list[httpx.Response], list[str]]:
        async with app_client(tmp_path) as (http, services, engine):
            answers = [
                await http.post("/api/v1/chat/completions", json={"model": MODEL, "messages": "not a list"}),
                await http.post("/api/v1/chat/completions", json={
                    "model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}),
                await http.post("/api/v1/load", json={"model_name": MODEL, "ctx_size": "big"}),
            ]
            return answers, engine.launches

    answers, launches = run(scenario)
    assert [a.status_code for a in answers] == [400, 404, 400]
    messages = [a.json()["error"]["message"] for a in answers]
    assert "messages" in messages[0] and "no-such-model" in messages[1] and "ctx_size" in messages[2]
    assert launches == []
