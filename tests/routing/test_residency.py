"""Routing helpers have a residency class of their own (runtime/router/scheduler.py, "Residency classes").

A `collection.router` whose router LLM is `picker` and whose candidate is `answerer`, on a server
with one chat slot: the picker a policy calls lives in the routing-helper pool, so it and the
answerer stay loaded together; the same process moves between pools as its use changes (promoted
when a policy calls a model a user had loaded, demoted when a user calls the picker directly, which
makes room in the standard pool); pins count per pool; deleting the router unloads the helper it
alone called. Every model is the real Gemma 3 270M GGUF under its own name (one file, separate
models and processes), so the processes' pids show what was kept and what was started again.

Gemma 270M rarely answers the router's JSON contract: when it does not, the policy falls back to its
default model, which is the answerer too, so every routed request ends at the answerer either way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import Server, ServerFactory

PICKER, ANSWERER, OTHER = "picker", "answerer", "other-chat"


@pytest.fixture(scope="module")
def server(module_servers: ServerFactory, tmp_path_factory: pytest.TempPathFactory, gemma_dir: Path) -> Server:
    root = tmp_path_factory.mktemp("residency-models")
    gemma = next(gemma_dir.glob("*.gguf"))
    for name in (PICKER, ANSWERER, OTHER):
        (root / f"{name}.gguf").symlink_to(gemma)
    # One standard chat slot (the shipped default, set here because every check below counts on it):
    # a helper sharing the machine with the answerer is what the helper pool is for.
    return module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(root)}, config={"max_loaded_models": 1})


@pytest.fixture
def http(server: Server) -> httpx.Client:
    with server.client() as client:
        assert client.post("/v1/unload", json={}).status_code == 200
        yield client
        for name in (PICKER, ANSWERER):
            client.post("/internal/pin", json={"model_name": name, "pinned": False})


def router_policy(picker: str, candidate: str) -> dict[str, Any]:
    return {"recipe": "collection.router", "version": "1", "components": sorted({picker, candidate}),
            "routing": {"candidates": [candidate], "default_model": candidate,
                        "router": {"type": "llm", "model": picker, "prompt": f"Always pick {candidate}."}}}


def register_router(http: httpx.Client, name: str, picker: str, candidate: str) -> str:
    resp = http.post("/v1/pull", json={"model_name": name, **router_policy(picker, candidate)})
    assert resp.status_code == 200, resp.text
    return name


def chat(http: httpx.Client, model: str) -> httpx.Response:
    return http.post("/v1/chat/completions", json={"model": model, "max_tokens": 2,
                                                   "messages": [{"role": "user", "content": "Say hi."}]})


def routed(http: httpx.Client, router: str, candidate: str) -> None:
    resp = chat(http, router)
    assert resp.status_code == 200, resp.text
    assert resp.json()["x_lemonade_route"]["route_to"] == candidate


def health(http: httpx.Client) -> dict[str, Any]:
    return http.get("/v1/health").json()


def resident(http: httpx.Client) -> dict[str, dict[str, Any]]:
    return {m["model_name"].removeprefix("extra."): m for m in health(http)["all_models_loaded"]}


def test_helper_pool_promotion_pins_and_demotion(http: httpx.Client) -> None:
    # A model the user loaded is an ordinary standard model...
    assert chat(http, PICKER).status_code == 200
    first = resident(http)[PICKER]
    assert (first["residency_class"], first["slot_pool"]) == ("standard", "standard/llm")

    # ...until a policy calls it: the same process moves to the helper pool, and the answerer gets the
    # one standard slot without evicting it.
    router = register_router(http, "user.PickerRouter", PICKER, ANSWERER)
    try:
        routed(http, router, ANSWERER)
        models = resident(http)
        assert models[PICKER]["slot_pool"] == "routing_helper/llm" and models[PICKER]["pid"] == first["pid"]
        assert models[ANSWERER]["slot_pool"] == "standard/llm"
        assert health(http)["max_models"]["llm"] == 1
        # The implicit model is the user-facing one, even right after the helper ran on its own (a policy
        # tried out by /v1/routing/validate runs its router model and serves nothing).
        tried = http.post("/v1/routing/validate", json={"policy": router_policy(PICKER, ANSWERER), "prompt": "hi"})
        assert tried.status_code == 200, tried.text
        assert resident(http)[PICKER]["last_use"] > resident(http)[ANSWERER]["last_use"]
        assert health(http)["model_loaded"].removeprefix("extra.") == ANSWERER
        routed(http, router, ANSWERER)  # warm: nothing is started again
        assert {n: m["pid"] for n, m in resident(http).items()} == {n: m["pid"] for n, m in models.items()}

        # Pins count per pool: a pinned answerer does not stop the helper from loading again.
        answerer_pid = models[ANSWERER]["pid"]
        assert http.post("/internal/pin", json={"model_name": ANSWERER, "pinned": True}).status_code == 200
        assert http.post("/v1/unload", json={"model_name": PICKER}).status_code == 200
        routed(http, router, ANSWERER)
        models = resident(http)
        assert models[PICKER]["slot_pool"] == "routing_helper/llm" and models[PICKER]["pid"] != first["pid"]
        assert models[ANSWERER]["pid"] == answerer_pid
        state = health(http)
        assert state["pinned_models"]["llm"] == 1 and state["pinned_helper_models"]["llm"] == 0
        assert http.post("/internal/pin", json={"model_name": PICKER, "pinned": True}).status_code == 200
        state = health(http)
        assert state["pinned_models"]["llm"] == 1 and state["pinned_helper_models"]["llm"] == 1

        # Used directly, the helper must join the standard pool, whose one slot a pinned model holds: 409,
        # and nothing moves.
        resp = chat(http, PICKER)
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "slots_pinned_error", resp.text
        assert resident(http)[PICKER]["slot_pool"] == "routing_helper/llm"

        # Unpinned, the direct use demotes the helper in place and the answerer leaves the slot to it.
        helper_pid = resident(http)[PICKER]["pid"]
        for name in (PICKER, ANSWERER):
            assert http.post("/internal/pin", json={"model_name": name, "pinned": False}).status_code == 200
        assert chat(http, PICKER).status_code == 200
        models = resident(http)
        assert ANSWERER not in models
        assert models[PICKER]["slot_pool"] == "standard/llm" and models[PICKER]["pid"] == helper_pid

        # Now an ordinary standard model, it is evicted by the next one like any other.
        assert chat(http, OTHER).status_code == 200
        assert set(resident(http)) == {OTHER}
    finally:
        http.post("/v1/delete", json={"model_name": "user.PickerRouter"})


def test_deleting_the_router_unloads_its_helper(http: httpx.Client) -> None:
    router = register_router(http, "user.ShortLivedRouter", PICKER, ANSWERER)
    routed(http, router, ANSWERER)
    assert resident(http)[PICKER]["slot_pool"] == "routing_helper/llm"
    assert http.post("/v1/delete", json={"model_name": router}).status_code == 200
    assert set(resident(http)) == {ANSWERER}  # no policy calls the picker any more; the answerer stays


def test_router_model_that_is_also_the_candidate_ends_standard(http: httpx.Client) -> None:
    router = register_router(http, "user.SelfRouter", ANSWERER, ANSWERER)
    try:
        chat(http, OTHER)  # holds the standard slot before the request
        routed(http, router, ANSWERER)
        models = resident(http)
        # Called first as the router (a helper), then as the candidate: one process, demoted in the same
        # request, and the earlier standard model made room for it.
        assert set(models) == {ANSWERER}
        assert models[ANSWERER]["slot_pool"] == "standard/llm"
    finally:
        http.post("/v1/delete", json={"model_name": router})
