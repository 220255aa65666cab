"""Warm swaps (issue 40), end to end on the real engine and Gemma 3 270M, with the shipped defaults.

One model at a time (`max_loaded_models` 1, the default): a conversation with a long system prompt,
a request to another model (which evicts the first), then the conversation's next turn: llama-server
reads only what is new, because the router saved the conversation's slot at the unload and restored
it at the load (`usage.prompt_tokens_details.cached_tokens`, as the client sees it). The same after
the server is stopped and started again. Gemma 3 is a sliding-window model: its restored state
continues only with its full window cache, which the server gives it here (5 % of this machine's
memory covers it; docs/warm-swaps.md). The file hygiene of the store is checked on the stand-in
(tests/unit/test_warm_swaps.py).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import Server, ServerFactory

A, B = "warm-a", "warm-b"
SYSTEM = " ".join(f"lemon{i % 37} river{i % 11} stone{i % 7}" for i in range(500))  # about 2,000 tokens


@pytest.fixture(scope="module")
def models(gemma_dir, tmp_path_factory) -> Path:
    """Gemma under two names: two models that take turns in the one llm slot."""
    folder = tmp_path_factory.mktemp("warm-models")
    gguf = next(gemma_dir.glob("*.gguf"))
    for name in (A, B):
        (folder / f"{name}.gguf").symlink_to(gguf)
    return folder


def chat(server: Server, model: str, messages: list[dict]) -> dict:
    with server.client(timeout=900) as http:
        resp = http.post("/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": 8,
                                                       "temperature": 0})
        assert resp.status_code == 200, resp.text
        return resp.json()


def cached(answer: dict) -> int:
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_conversation_survives_a_swap_and_a_restart(make_server: ServerFactory, models: Path):
    env = {"LEMONADE_EXTRA_MODELS_DIR": str(models)}
    server = make_server(env=env)
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a fruit."}]
    first = chat(server, A, turn1)
    prefix = first["usage"]["prompt_tokens"]
    assert prefix > 1500 and cached(first) == 0

    chat(server, B, [{"role": "user", "content": "Hello"}])  # A leaves its slot to B
    with server.client() as http:
        health = http.get("/v1/health").json()
    assert [m["model_name"] for m in health["all_models_loaded"]] == [B]
    assert health["kv_store"]["states"] >= 1 and health["kv_store"]["enabled"]
    # A's prompt (several CPU-seconds) is counted as this server's share of the load average, which an
    # engine started now does not count as other work (backends/cpu_share.py); the server's own few tenths
    # of a second would stay below 0.05
    deadline = time.monotonic() + 15  # the share is sampled every 5 s
    while health["cpu_load"]["ours"] < 0.05 and time.monotonic() < deadline:
        time.sleep(1)
        with server.client() as http:
            health = http.get("/v1/health").json()
    assert health["cpu_load"]["ours"] >= 0.05, health["cpu_load"]

    turn2 = turn1 + [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "Name another."}]
    second = chat(server, A, turn2)
    assert cached(second) >= 0.99 * prefix, second["usage"]

    # stopped and started again on the same folders: the conversation is still warm
    server.stop()
    server = make_server(env=env, cache=server.cache)
    turn3 = turn2 + [{"role": "assistant", "content": second["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "And one more."}]
    third = chat(server, A, turn3)
    assert cached(third) >= 0.99 * prefix, third["usage"]
    saved = [json.loads(p.read_text()) for p in (server.cache / "slots").glob("*/warm-*.json")]
    assert saved and not list((server.cache / "slots").glob("**/*.partial"))


def test_a_state_is_not_restored_into_another_context(make_server: ServerFactory, models: Path):
    """The fingerprint: a state saved by a load with one context is never restored into another. (A
    short conversation: any state restored would show as cached tokens.)"""
    server = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(models)})
    convo = [{"role": "system", "content": SYSTEM[:400]}, {"role": "user", "content": "Name a fruit."}]
    with server.client(timeout=900) as http:
        assert http.post("/v1/load", json={"model_name": A, "ctx_size": 8192}).status_code == 200
        chat(server, A, convo)
        assert http.post("/v1/load", json={"model_name": A, "ctx_size": 4096}).status_code == 200
    answer = chat(server, A, convo + [{"role": "user", "content": "Another."}])
    assert cached(answer) == 0


def test_a_new_conversation_starts_from_the_system_prompt_another_slot_holds(make_server: ServerFactory,
                                                                             models: Path):
    """Two conversations with the same long system prompt, one after the other: the second goes to an
    empty slot (the first keeps its own) and starts from the first slot's state, copied through the
    engine's slot save and restore, so llama-server reads only what follows the system prompt."""
    server = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(models)})
    first = chat(server, A, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a fruit."}])
    second = chat(server, A, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a tree."}])
    system_tokens = first["usage"]["prompt_tokens"] - 20  # the system prompt, less the user's turn and the template
    assert cached(first) == 0 and cached(second) >= system_tokens, second["usage"]
    # and the first conversation still has its own slot: its next turn reads only what is new
    third = chat(server, A, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a fruit."},
                             {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                             {"role": "user", "content": "Another."}])
    assert cached(third) >= first["usage"]["prompt_tokens"] - 2, third["usage"]
    assert not [p for p in (server.cache / "slots").glob("**/*copy*")]


def test_conversations_arriving_together_read_their_system_prompt_once(make_server: ServerFactory, models: Path):
    """Three conversations with the same long system prompt arrive together: no slot holds it yet, so
    the first reads it and the other two hold until its slot is idle and start from a copy of it
    (runtime/slot_affinity.py, `lend_donor`), rather than all three reading it at once."""
    server = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(models)})
    # a first answer tells the server how fast the engine reads on this machine now (it bounds the holds)
    other = " ".join(f"apple{i % 13} cloud{i % 5}" for i in range(400))
    chat(server, A, [{"role": "system", "content": other}, {"role": "user", "content": "Name a fruit."}])
    questions = ["Name a fruit.", "Name a tree.", "Name a river."]
    with ThreadPoolExecutor(len(questions)) as pool:
        answers = list(pool.map(lambda q: chat(server, A, [{"role": "system", "content": SYSTEM},
                                                           {"role": "user", "content": q}]), questions))
    system_tokens = answers[0]["usage"]["prompt_tokens"] - 20  # the system prompt, less the user's turn and template
    read_in_full = [a for a in answers if cached(a) == 0]
    copied = [a for a in answers if cached(a) >= system_tokens]
    assert (len(read_in_full), len(copied)) == (1, 2), [a["usage"] for a in answers]
