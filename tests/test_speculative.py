"""Issue 41: speculative decoding on the real llama-server (b11312) with the real Gemma 3 270M.

The server runs as a user gets it (`speculation: auto`): draftless n-gram speculation, kept on by the
controller while it earns (runtime/speculation.py). Every figure asserted is read from the engine
(`timings.draft_n` / `draft_n_accepted`, its command line in /v1/health); no timing is asserted.
Gemma 3 270M is a base model: asked to continue a JSON list it repeats the prompt, which is what
n-gram drafts are made of. The controller's rules themselves: tests/unit/test_speculation_rules.py.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import httpx
import openai
import pytest
import websockets.sync.client as ws_client

from lemonade.backends.llamacpp.spec import NGRAM_ARGS
from tests.helpers import GEMMA_ID, GEMMA_NAME, run_cli
from tests.hub import fixtures as fx

FRUITS = """[{"id": 1, "name": "apple", "color": "red", "price": 1.2},
 {"id": 2, "name": "banana", "color": "yellow", "price": 0.5},
 {"id": 3, "name": "cherry", "color": "red", "price": 3.0},
 {"id": 4, "name": "grape", "color": "purple", "price": 2.1},"""
EDIT = [{"role": "user", "content": "Continue this list:\n\n" + FRUITS}]
PROMPTS = [EDIT, [{"role": "user", "content": "Rewrite this code, renaming `subtotal` to `net`:\n\n"
                   "def total(items):\n    subtotal = 0\n    for item in items:\n        subtotal += item.price\n"
                   "    return subtotal\n"}],
           [{"role": "user", "content": "Describe your ideal weekend in a few sentences."}]]
NGRAM = NGRAM_ARGS[1]  # the draftless kind every model gets
NEAR_TIE = 0.5  # logprob: two tokens this close are a hesitation that batch-size numerics can tip


@pytest.fixture(scope="module")
def server(gemma_server):
    return gemma_server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def chat(server, messages: list[dict[str, str]], max_tokens: int = 64, **extra: Any) -> dict[str, Any]:
    """A greedy chat answer as llama-server gives it (its `timings` included). No prompt cache: a prompt
    found in the cache is evaluated in another batch shape, which alone can tip a near tie."""
    body = {"model": GEMMA_NAME, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "cache_prompt": False, **extra}
    resp = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=600)
    assert resp.status_code == 200, resp.text
    return resp.json()


def engine_command(server) -> list[str]:
    with httpx.Client(base_url=server.url) as c:
        return c.get("/v1/health").json()["all_models_loaded"][0]["launch_command"]


def spec_type(server) -> str | None:
    command = engine_command(server)
    return command[command.index("--spec-type") + 1] if "--spec-type" in command else None


def stats(server) -> dict[str, Any]:
    with httpx.Client(base_url=server.url) as c:
        return c.get("/v1/stats").json()


def test_an_edit_style_request_is_drafted_and_its_figures_are_shown(server):
    answer = chat(server, EDIT)
    assert spec_type(server) == NGRAM  # the draftless kind every model can have
    timings = answer["timings"]
    assert timings["draft_n"] > 0 and 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    last = stats(server)
    assert last["draft_tokens"] == timings["draft_n"] and last["draft_accepted_tokens"] == timings["draft_n_accepted"]
    assert last["draft_acceptance_rate"] == round(timings["draft_n_accepted"] / timings["draft_n"], 4)
    assert last["draft_tokens_total"] >= timings["draft_n"]
    mine = last["speculation"][GEMMA_NAME]
    assert mine["type"] == NGRAM and mine["mode"] == "auto" and mine["wanted"] is True
    assert mine["draft_tokens"] >= timings["draft_n"] and mine["acceptance_rate"] is not None
    with httpx.Client(base_url=server.url) as c:
        metrics = c.get("/metrics").text
    assert f'lemonade_speculation_active{{model_name="{GEMMA_NAME}",type="{NGRAM}"}} 1.0' in metrics
    rate = re.search(rf'lemonade_speculation_acceptance_rate{{model_name="{GEMMA_NAME}"}} ([0-9.]+)', metrics)
    assert rate and float(rate.group(1)) == mine["acceptance_rate"]
    assert re.search(r"lemonade_llamacpp_spec_decode_num_accepted_tokens_total\{[^}]*\} [1-9]", metrics)  # the engine's


def test_outputs_are_the_same_with_and_without_speculation(server):
    """At temperature 0 speculation keeps the model's choices: an answer is the stock answer, or parts
    from it only where the stock engine itself hesitated between two tokens (llama.cpp on a CPU is not
    bit-identical across batch sizes, and drafted tokens are checked in a batch). The stock answers are
    asked with `speculation: off`, which starts the engine again without it."""
    speculated = [chat(server, p, 96) for p in PROMPTS]
    assert sum(a["timings"].get("draft_n_accepted", 0) for a in speculated) > 0
    stock = [chat(server, p, 96, speculation="off") for p in PROMPTS]
    assert spec_type(server) is None and all("draft_n" not in a["timings"] for a in stock)
    for prompt, mine, theirs in zip(PROMPTS, speculated, stock, strict=True):
        text, reference = mine["choices"][0]["message"]["content"], theirs["choices"][0]["message"]["content"]
        if text == reference:
            continue
        at = next((i for i, (x, y) in enumerate(zip(text, reference, strict=False)) if x != y),
                  min(len(text), len(reference)))
        tokens = chat(server, prompt, 96, logprobs=True, top_logprobs=2)["choices"][0]["logprobs"]["content"]
        seen = 0
        for token in tokens:
            seen += len(token["token"])
            if seen > at:
                top = [t["logprob"] for t in token["top_logprobs"]]
                assert top[0] - top[1] < NEAR_TIE, (at, token, text, reference)
                break
    chat(server, EDIT, 16, speculation="on")  # back to what the other tests expect
    assert spec_type(server) == NGRAM


def test_a_request_reading_token_probabilities_is_served_without_speculation(server, client):
    """llama-server gives no probabilities for tokens accepted from a draft: such a request is served by
    the engine started again without speculation, and the controller keeps it off for a while."""
    chat(server, EDIT, 16, speculation="on")
    assert spec_type(server) == NGRAM
    resp = client.chat.completions.create(model=GEMMA_NAME, messages=EDIT, max_tokens=48, temperature=0,
                                          logprobs=True, top_logprobs=2, extra_body={"cache_prompt": False})
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in content)
    assert spec_type(server) is None
    assert "token probabilities" in stats(server)["speculation"][GEMMA_NAME]["reason"]
    assert "draft_n" not in chat(server, EDIT)["timings"]  # and later requests too, while it holds
    chat(server, EDIT, 16, speculation="on")  # a request may start a trial
    assert spec_type(server) == NGRAM


def test_the_model_option_forces_it_off_and_bad_values_are_refused(server):
    with httpx.Client(base_url=server.url, timeout=300) as c:
        bad = c.post(f"/v1/models/{GEMMA_ID}/options", json={"speculation": "sometimes"})
        assert bad.status_code == 400
        assert "'speculation' must be one of auto, on, off, got 'sometimes'" in bad.json()["error"]["message"]
        refused = c.post("/v1/chat/completions", json={"model": GEMMA_NAME, "messages": EDIT, "speculation": 1})
        assert refused.status_code == 400 and "'speculation' must be one of auto, on, off" in refused.text
        assert c.post(f"/v1/models/{GEMMA_ID}/options", json={"speculation": "off"}).status_code == 200
        assert c.post("/v1/load", json={"model_name": GEMMA_ID}).status_code == 200  # its options changed: reloaded
        try:
            assert spec_type(server) is None
            answer = chat(server, EDIT)
            assert "draft_n" not in answer["timings"] and stats(server)["draft_tokens"] is None
            assert stats(server)["speculation"][GEMMA_NAME]["mode"] == "off"
        finally:
            c.post(f"/v1/models/{GEMMA_ID}/options", json={"speculation": None})
            c.post("/v1/load", json={"model_name": GEMMA_ID})
    chat(server, EDIT, 16, speculation="on")
    assert spec_type(server) == NGRAM


def test_the_span_carries_the_drafts_and_the_measured_speedup(server):
    """Three answers without speculation teach the controller the model's stock speed; the span of a
    drafted answer then says what speculation did for it."""
    for prompt in PROMPTS[1:] + PROMPTS[2:]:
        chat(server, prompt, 48, speculation="off", ignore_eos=True)  # timed answers: 32 tokens or more
    chat(server, EDIT, 16, speculation="on")
    url = server.url.replace("http", "ws") + "/spans/stream?client_session_id=spec-test"
    with ws_client.connect(url) as ws:
        answer = httpx.post(server.url + "/v1/chat/completions", headers={"X-Client-Session-Id": "spec-test"},
                            json={"model": GEMMA_NAME, "messages": EDIT, "max_tokens": 64, "temperature": 0,
                                  "cache_prompt": False}, timeout=600).json()
        span = json.loads(ws.recv(timeout=60))
    attrs = {a["key"]: next(iter(a["value"].values())) for a in span["attributes"]}
    timings = answer["timings"]
    assert attrs["lemon.speculation.type"] == NGRAM
    assert int(attrs["lemon.speculation.draft_tokens"]) == timings["draft_n"] > 0
    assert int(attrs["lemon.speculation.accepted_tokens"]) == timings["draft_n_accepted"]
    assert float(attrs["lemon.speculation.speedup"]) == stats(server)["speculative_speedup"] > 0


def test_a_draft_model_beside_the_model_is_pulled_and_drafts(make_server, hub):
    """A `mtp-*` GGUF beside a model becomes its `draft` checkpoint at pull time and reaches
    llama-server as its draft model: without the `mtp` label, `draft-simple` (llama-server b11312 loads
    a --model-draft without a --spec-type and never uses it). Gemma 3 270M is its own draft model here
    (the one model this machine has offline): it proposes what the model itself says."""
    repo = "spec-org/gemma-3-270m-GGUF"
    folder = hub.clone_repo(fx.GEMMA_REPO, repo)
    os.link(folder / fx.GEMMA_FILE, folder / "mtp-gemma-3-270m.gguf")
    server = make_server(env=hub.env())
    out = run_cli(server, "pull", repo, "--variant", "Q4_K_M")
    assert out.returncode == 0, out.stderr + out.stdout
    name = "user.gemma-3-270m-GGUF-Q4_K_M"
    with server.client() as c:
        assert c.get(f"/v1/models/{name}").json()["checkpoints"]["draft"] == f"{repo}:mtp-gemma-3-270m.gguf"
        resp = c.post("/v1/chat/completions", json={"model": name, "messages": EDIT, "max_tokens": 48,
                                                    "temperature": 0, "cache_prompt": False})
        assert resp.status_code == 200, resp.text
        [loaded] = c.get("/v1/health").json()["all_models_loaded"]
    command = loaded["launch_command"]
    assert command[command.index("--model-draft") + 1].endswith("mtp-gemma-3-270m.gguf")
    assert command[command.index("--spec-type") + 1] == "draft-simple"
    timings = resp.json()["timings"]
    assert timings["draft_n"] > 0 and timings["draft_n_accepted"] > 0
